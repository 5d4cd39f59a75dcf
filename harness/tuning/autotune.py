"""`triton.autotune` kernels as tunables, steered by the harness without editing the kernel.

Most Triton kernels in the wild choose their launch config with `@triton.autotune(configs=[...],
key=[...])`. Those configs become the impl's tunables, as a `Tuner`'s fields do:

    the autotuned kernels the impl's code refers to (referenced_kernels; also behind
    `triton.heuristics`), else, for a triton/library impl, those of provenance.reachable
      -> AutotunedKernel "my_ops._swiglu_kernel": fields BLOCK_SIZE, num_warps, num_stages
         (every kwarg of its triton.Configs, then the launch options; num_ctas and maxnreg only
         where a config sets them), valid values: those its configs take
      -> Impl.tunables(): BLOCK_SIZE, num_warps, ... (`_swiglu_kernel.BLOCK_SIZE` where several
         autotuned kernels, or an unprefixed Tuner, are reachable)

`steering(impl)` (the worker wraps every case's calls in it, inside harness.tuning.forcing and
recording) changes the Autotuner objects for the duration of the block and puts them back:
  forced    (a YAML config) `configs` := the forced config (all fields: a config of the list,
            or one outside it with those values), or the configs matching the forced fields
            (some), which the autotuner times; the kernel's own `early_config_prune` must keep
            a forced config (checked at spec load where it needs no arguments, else at the
            first call: the case fails with one line);
  CPU       (TRITON_INTERPRET=1) `configs` := the first config (or the first forced one): it
            runs, nothing is benchmarked (the autotuner's do_bench needs a GPU driver);
  compile  (compile-ahead, harness.tuning.compile_only) every config launched once, so it is
            compiled; none timed, nothing kept (not in Triton's on-disk autotune cache of
            `cache_results` either: the call runs with it off);
  set-up    (harness.tuning.setup: an op's binder running what the measured call needs, e.g.
            the forward of a measured backward) the first config that launches is used, the
            others neither launched nor timed; the key leaves the cache after the call (a
            measured call of the same key benchmarks) and nothing is logged;
  GPU       nothing forced: the autotuner benchmarks as always and its own per-config timings
            (`_bench`: the median of do_bench, ms) are kept per key as the pick's evidence
            (harness.tuning.remember -> tuner_picks.json -> `harness picks RUN`); a pick made
            earlier in the run is put in its cache first, so the time and profiler passes run
            the check pass's pick without benchmarking again.
Every config used is logged (harness.tuning.record) with its source: forced | autotune | single
| interpreter. The next run does not inherit autotune picks (harness.execute.previous): the
autotuner chooses again, and the since block says when it chose differently.

Triton versions: the Autotuner of triton 3.6 (GPU) and 3.9 (CI) has `configs` (triton.Config
list), `cache` (key -> Config), `_bench(*args, config, **meta)` (-> [median, p20, p80] ms),
`run`, `best_config`, `arg_names` and `early_config_prune`. Duck-typed: an object without
`configs`/`cache` is no autotuned kernel; without `_bench` nothing is timed into evidence.
"""
from __future__ import annotations

import ast
import copy
import functools
import inspect
import math
import os
import sys
import time
from contextlib import ExitStack, contextmanager
from types import ModuleType
from typing import Any, Iterator, Mapping

from harness import tuning
from harness.tuning import gpu_lock
from harness.tuning.provenance import _kernel_interface, reachable, unwrap

LAUNCH = ("num_warps", "num_stages", "num_ctas", "maxnreg")
OPTIONAL = {"num_ctas": 1, "maxnreg": None}  # fields only where a config sets another value
_MISSING = object()
_DECLARED: dict[int, list] = {}  # id(autotuner) -> its own configs, while a block steers it


def interpreted() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def is_autotuner(obj) -> bool:
    configs = getattr(obj, "configs", None)
    return (isinstance(configs, (list, tuple)) and len(configs) > 0
            and isinstance(getattr(obj, "cache", None), dict)
            and callable(getattr(obj, "run", None))
            and all(isinstance(getattr(c, "kwargs", None), dict) for c in configs))


def _fmt(config: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items())


class AutotunedKernel:
    """One reachable `triton.autotune` kernel seen as a Tuner (name, fields, valid_values,
    violated), with the kernel's `early_config_prune` as its one rule."""

    def __init__(self, name: str, short: str, autotuner):
        self.name = name  # "<module>.<kernel>": its picks' name in the store and the log
        self.short = short  # the kernel's name: the tunables' prefix when several
        self.autotuner = autotuner
        # as declared (a steered autotuner's attribute holds the configs of one case)
        self.configs = list(_DECLARED.get(id(autotuner), autotuner.configs))
        kwargs = list(dict.fromkeys(k for c in self.configs for k in c.kwargs))
        launch = [k for k in LAUNCH if k not in OPTIONAL or any(
            getattr(c, k, OPTIONAL[k]) != OPTIONAL[k] for c in self.configs)]
        self.fields: tuple[str, ...] = tuple(kwargs + [k for k in launch if k not in kwargs])
        self._values: dict[str, list] = {f: [] for f in self.fields}
        for c in self.configs:
            for f, v in self.as_dict(c).items():
                if v not in self._values[f]:
                    self._values[f].append(v)

    def __repr__(self) -> str:
        return f"AutotunedKernel({self.name!r}, fields={self.fields})"

    # -- what a YAML config is validated against (as kernels._tuner.Tuner) ---------------------
    def valid_values(self, field: str) -> tuple:
        return tuple(sorted(self._values[field], key=lambda v: (str(type(v)), v)))

    def violated(self, config: Mapping[str, Any]) -> str | None:
        """Why the kernel rejects `config` (some or all fields), else None: its own
        `early_config_prune`, asked without the call's arguments, keeps some of the kernel's
        configs but none of those `config` stands for. A pruner that needs the arguments (it
        raises, or keeps nothing of the kernel's own list) is asked at the first call instead."""
        prune = getattr(self.autotuner, "early_config_prune", None)
        if not prune:
            return None
        try:
            if not prune(list(self.configs), {}):
                return None
            kept = prune(self.configs_for(config), {})
        except Exception:  # it needs the kernel's arguments: checked when the kernel runs
            return None
        return None if kept else f"the kernel's early_config_prune ({_name(prune)})"

    # -- configs as field dicts --------------------------------------------------------------
    def as_dict(self, cfg) -> dict[str, Any]:
        out = {}
        for f in self.fields:
            v = cfg.kwargs[f] if f in cfg.kwargs else getattr(cfg, f, _MISSING)
            if v is not _MISSING and v is not None:
                out[f] = v.item() if hasattr(v, "item") else v
        return out

    def make(self, values: Mapping[str, Any], like):
        """A copy of triton.Config `like` with `values` replacing its fields."""
        cfg = copy.copy(like)
        cfg.kwargs = {**like.kwargs, **{k: v for k, v in values.items() if k not in LAUNCH}}
        for k in LAUNCH:
            if k in values:
                setattr(cfg, k, values[k])
        return cfg

    def configs_for(self, fixed: Mapping[str, Any]) -> list:
        """The configs a forced `fixed` stands for: all fields -> that config (the kernel's own
        where it is in the list); some -> the kernel's configs with those values, or when none
        has them, its first config with them replaced."""
        matching = [c for c in self.configs
                    if all(self.as_dict(c).get(f) == v for f, v in fixed.items())]
        if set(self.fields) <= set(fixed):
            return matching[:1] or [self.make(fixed, self.configs[0])]
        return matching or [self.make(fixed, self.configs[0])]


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


SKIP_PACKAGES = frozenset({"torch", "triton", "numpy", "harness"}) | frozenset(
    getattr(sys, "stdlib_module_names", ()))
WALK_LIMIT = 2000  # functions visited per impl (a guard; user code paths are far smaller)


def referenced_kernels(fn) -> list[tuple[str, Any]]:
    """(name, wrapper) of the Triton kernels the impl function's code refers to: the globals,
    closure cells and attributes of modules its code names, followed into the functions,
    classes (their methods), instances (their class) and tables (dict, list, tuple) they name
    in turn, across packages except torch, triton, numpy, the harness and Python's own.
    Narrower than provenance.reachable (the whole module): a torch impl beside a Triton kernel
    in one file refers to none."""
    ki = _kernel_interface()
    if ki is None:
        return []
    found: dict[int, tuple[str, Any]] = {}
    seen: set[int] = set()
    stack = [fn]

    def skipped(obj) -> bool:
        mod = getattr(obj, "__name__", None) if isinstance(obj, ModuleType) else \
            getattr(obj, "__module__", None)
        return not isinstance(mod, str) or mod.split(".")[0] in SKIP_PACKAGES

    def visit(obj, names: set[str], depth: int = 0) -> None:
        if isinstance(obj, ki):
            inner = getattr(unwrap(obj), "fn", None)
            found.setdefault(id(obj), (getattr(inner, "__name__", None) or repr(obj), obj))
        elif isinstance(obj, ModuleType):
            if not skipped(obj):
                for n in names:
                    v = getattr(obj, n, None)
                    if v is not None and not isinstance(v, ModuleType):
                        visit(v, set(), depth + 1)
        elif isinstance(obj, functools.partial):
            stack.append(obj.func)
        elif inspect.isclass(obj):  # its methods (an autograd.Function's forward, ...)
            if not skipped(obj):
                for v in list(vars(obj).values()):
                    stack.append(getattr(v, "__func__", v))
        elif inspect.isfunction(obj) or inspect.ismethod(obj):
            if not skipped(obj):
                stack.append(getattr(obj, "__func__", obj))
        elif isinstance(obj, (dict, list, tuple)):  # a table of kernels
            if depth < 3:
                for v in list(obj.values() if isinstance(obj, dict) else obj)[:256]:
                    visit(v, set(), depth + 1)
        elif not isinstance(obj, (str, bytes, int, float, bool)) and not skipped(type(obj)):
            visit(type(obj), names, depth + 1)  # an instance of a user class: its methods

    while stack and len(seen) < WALK_LIMIT:
        f = stack.pop()
        code = getattr(f, "__code__", None)
        if code is None or id(f) in seen:
            continue
        seen.add(id(f))
        names: set[str] = set()
        codes = [code]
        while codes:
            c = codes.pop()
            names.update(c.co_names)
            codes.extend(k for k in c.co_consts if inspect.iscode(k))
        glb = getattr(f, "__globals__", {})
        for n in names:
            if n in glb:
                visit(glb[n], names)
        for cell in getattr(f, "__closure__", None) or ():
            try:
                visit(cell.cell_contents, names)
            except ValueError:  # an empty cell
                pass
        wrapped = getattr(f, "__wrapped__", None)
        if wrapped is not None:
            stack.append(wrapped)
    return sorted(found.values(), key=lambda t: t[0])


def autotuned_kernels(fn, taken: Mapping[str, Any] = (), module_wide: bool = True
                      ) -> dict[str, AutotunedKernel]:
    """{prefix: AutotunedKernel} for the `triton.autotune` kernels of impl function `fn`: those
    its code refers to (referenced_kernels); where it refers to none and `module_wide`, those
    provenance's walk reaches (its module and the modules of its package: a kernel found
    through a table or getattr). Prefix "" for the only one (unless a Tuner in `taken` is
    unprefixed), else the kernel's name."""
    try:
        kernels = referenced_kernels(fn)
        if not any(_autotuners(w) for _, w in kernels) and module_wide:
            kernels = [(n, w) for n, w, _ in reachable(fn)[1]]
    except Exception:  # the walk failed: no autotuned tunables, the impl still runs
        return {}
    found: list[AutotunedKernel] = []
    seen: set[int] = set()
    for name, wrapper in kernels:
        for at in _autotuners(wrapper):
            if id(at) not in seen:
                seen.add(id(at))
                py = getattr(unwrap(at), "fn", None)
                found.append(AutotunedKernel(f"{getattr(py, '__module__', '?')}.{name}", name,
                                             at))
    if len(found) == 1 and "" not in taken:
        return {"": found[0]}
    shorts = [k.short for k in found]
    return {(k.short if shorts.count(k.short) == 1 else k.name): k for k in found}


def _autotuners(wrapper) -> list:
    """The Autotuners in a kernel's wrapper chain (autotune, heuristics, a library's own
    KernelInterface wrappers: each holds the next as `.fn`)."""
    out, obj = [], wrapper
    for _ in range(8):
        if obj is None:
            break
        if is_autotuner(obj):
            out.append(obj)
        obj = getattr(obj, "fn", None)
    return out


# -- steering, per case ------------------------------------------------------------------------

class _WatchedCache(dict):
    """The autotuner's cache inside a steered block: it remembers the key last looked up (the
    key the autotuner computed for the call: no copy of its key rule here)."""

    last: Any = None

    def __getitem__(self, key):
        self.last = key
        return dict.__getitem__(self, key)


def _stored_key(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _MISSING  # a key holding something without a literal form: benchmarked again


class _Steer:
    """One autotuned kernel steered for one block (see the module docstring)."""

    def __init__(self, kernel: AutotunedKernel, fixed: dict | None, interp: bool):
        self.k, self.fixed, self.interp = kernel, dict(fixed or {}), interp
        self.at = kernel.autotuner
        self.saved: dict[str, Any] = {}
        self.used: dict[Any, Any] = {}  # key (None: no key looked up) -> Config used
        self.timings: list[tuple[int, Any, Any, float]] = []  # (cache size, config, result, s)
        self.seeded: dict[Any, str] = {}  # key -> the source of the pick put in the cache
        self.pruned_ok = not self.fixed  # forced: the kernel's pruner is asked at the first call
        self.compile_only = False  # a compile-ahead call launched the configs untimed
        self._setup_benched = False  # the current call benched untimed (harness.tuning.setup)
        self._setup_launched = False  # and one of its configs launched

    def _set(self, attr: str, value) -> None:
        self.saved.setdefault(attr, self.at.__dict__.get(attr, _MISSING))
        setattr(self.at, attr, value)

    def _restore(self) -> None:
        for attr, old in self.saved.items():
            if old is _MISSING:
                self.at.__dict__.pop(attr, None)
            else:
                setattr(self.at, attr, old)

    def _seed(self, configs: list) -> dict:
        """Picks to start from: this process's (the autotuner's own cache) and the run's stored
        ones of the same forcing, as Configs of `configs`."""
        seed: dict = {}
        if not self.fixed:
            for key, cfg in self.at.cache.items():
                seed[key], self.seeded[key] = cfg, "autotune"
        want = tuple(sorted(self.fixed.items()))
        for text, rec in tuning.stored_picks(self.k.name).items():
            key = _stored_key(text)
            forced = rec.get("source") == "forced"
            if key is _MISSING or forced != bool(self.fixed):
                continue
            if forced:
                if not (isinstance(key, tuple) and len(key) == 2 and key[1] == want):
                    continue
                key = key[0]
            cfg = next((c for c in configs if self.k.as_dict(c) == rec.get("config")), None)
            if cfg is not None and key not in seed:
                seed[key], self.seeded[key] = cfg, rec.get("source") or "autotune"
        return seed

    def __enter__(self):
        at = self.at
        _DECLARED.setdefault(id(at), list(self.k.configs))
        configs = self.k.configs_for(self.fixed) if self.fixed else list(self.k.configs)
        if self.interp:
            configs = configs[:1]
        self.configs = configs
        self._set("configs", configs)
        self.cache = _WatchedCache(self._seed(configs) if not self.interp else {})
        self._set("cache", self.cache)
        orig_run = at.run
        if not self.interp and callable(getattr(at, "_bench", None)):
            orig_bench = at._bench

            def bench(*args, config, **meta):
                if tuning.compiling_only():
                    return self._launch_once(orig_bench, args, config, meta)
                if tuning.in_setup():  # outside the measured call: the first that launches
                    self._setup_benched = True
                    if self._setup_launched:  # the others are neither launched nor timed
                        return [float("inf")] * 3
                    res = self._launch_once(orig_bench, args, config, meta, mark=False)
                    self._setup_launched = all(math.isfinite(x) for x in res)
                    return res
                n, t0 = len(self.cache), time.perf_counter()
                with gpu_lock.exclusive():  # timed alone (another process may share the GPU)
                    res = orig_bench(*args, config=config, **meta)
                self.timings.append((n, config, res, time.perf_counter() - t0))
                return res

            self._set("_bench", bench)

        def run(*args, **kwargs):
            if not self.pruned_ok:
                self._check_prune(args, kwargs)
            self.cache.last = None
            self._setup_benched = self._setup_launched = False
            # launched untimed (compile-ahead, set-up): the ties must not reach the on-disk
            # autotune cache of `cache_results` (TRITON_CACHE_AUTOTUNING), where a later
            # process would read the first config as timed
            untimed = tuning.compiling_only() or tuning.in_setup()
            disk = at.__dict__.get("cache_results", _MISSING) if untimed else _MISSING
            if disk is not _MISSING:
                at.cache_results = False
            try:
                out = orig_run(*args, **kwargs)
            finally:
                if disk is not _MISSING:
                    at.cache_results = disk
                if self._setup_benched:  # an untimed set-up pick: never kept for a measured
                    self.cache.pop(self.cache.last, None)  # call, even if this one raised
            if not (self._setup_benched or tuning.in_setup()):  # the measured call's only
                cfg = getattr(at, "best_config", None)
                self.used[self.cache.last] = cfg if cfg is not None else configs[0]
            return out

        self._set("run", run)
        return self

    def _launch_once(self, orig_bench, args, config, meta, mark: bool = True):
        """Compile-ahead (and set-up, `mark` False): the autotuner's `_bench` with a do_bench
        that launches the config once (so it compiles) and times nothing; every config ties,
        the first is kept."""
        self.compile_only = self.compile_only or mark
        old = self.at.__dict__.get("do_bench", _MISSING)
        self.at.do_bench = lambda kernel_call, quantiles=None, **_: (kernel_call(), [0.0] * 3)[1]
        try:
            return orig_bench(*args, config=config, **meta)
        finally:
            if old is _MISSING:
                self.at.__dict__.pop("do_bench", None)
            else:
                self.at.do_bench = old

    def _check_prune(self, args, kwargs) -> None:
        prune = getattr(self.at, "early_config_prune", None)
        self.pruned_ok = True
        if not prune:
            return
        nargs = dict(zip(getattr(self.at, "arg_names", ()), args))
        if not prune(list(self.configs), nargs, **kwargs):
            raise ValueError(f"{self.k.name}: forced {_fmt(self.fixed)} is rejected by the "
                             f"kernel's early_config_prune ({_name(prune)}) for these arguments")

    def __exit__(self, exc_type, *exc) -> None:
        self._restore()
        if "configs" in self.saved:
            _DECLARED.pop(id(self.at), None)
        if exc_type is None:
            self._harvest()

    def _harvest(self) -> None:
        if self.compile_only:  # nothing was timed: nothing to record or keep
            return
        keys = list(self.cache)
        groups: dict[Any, list] = {}
        for n, cfg, res, secs in self.timings:
            if n < len(keys):
                groups.setdefault(keys[n], []).append((cfg, res, secs))
        for key, cfg in self.used.items():
            if self.fixed:
                source = "forced"
            elif key in groups:
                source = "autotune"
            elif key in self.seeded:
                source = self.seeded[key]
            elif self.interp:
                source = "interpreter"
            else:  # one config (or one left after pruning), or triton's own on-disk cache
                source = "single" if key is None or len(self.configs) == 1 else "autotune"
            tuning.record(self.k.name, key, self.k.as_dict(cfg), source)
        for key, rows in groups.items():
            if key not in self.cache:
                continue
            store_key = (key, tuple(sorted(self.fixed.items()))) if self.fixed else key
            tuning.remember(self.k.name, store_key, self.k.as_dict(self.cache[key]),
                            "forced" if self.fixed else "autotune", self._evidence(rows))
        if not self.fixed and not self.interp:  # the autotuner keeps its picks, as on its own
            self.at.cache.update(self.cache)

    def _evidence(self, rows: list) -> dict:
        """The autotuner's own timings of one key, in the order it timed them; a config it
        timed as inf (out of resources, did not compile) and one pruned before timing get
        an error instead (the shape of kernels._tuner's evidence: `harness picks`)."""
        out, timed = [], []
        for cfg, res, _ in rows:
            timed.append(cfg)
            q = list(res) if isinstance(res, (list, tuple)) else [res]
            row: dict[str, Any] = {"config": self.k.as_dict(cfg)}
            ms = q[0] if q else None
            if isinstance(ms, (int, float)) and math.isfinite(ms):
                row["ms"] = float(ms)
                if len(q) >= 3 and all(isinstance(x, (int, float)) for x in q[1:3]):
                    row["p20_ms"], row["p80_ms"] = float(q[1]), float(q[2])
            else:
                row["error"] = "timed as inf by the autotuner (out of resources or did not compile)"
            out.append(row)
        for c in self.configs:
            if not any(c == t for t in timed):
                out.append({"config": self.k.as_dict(c),
                            "error": "not timed (pruned by the kernel's prune_configs_by)"})
        return {"candidates": out, "by": "triton.autotune",
                "bench_s": round(sum(s for _, _, s in rows), 3)}


@contextmanager
def steering(impl) -> Iterator[None]:
    """Within the block the impl's autotuned kernels run as harness.tuning says (forced
    configs, recording) and as the device allows (the interpreter: no benchmarking)."""
    kernels = [t for t in impl.all_tuners().values() if isinstance(t, AutotunedKernel)]
    if not kernels:
        yield
        return
    interp = interpreted()
    with ExitStack() as stack:
        for k in kernels:
            stack.enter_context(_Steer(k, tuning.forced(k.name), interp))
        yield
