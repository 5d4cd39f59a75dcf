"""`triton.autotune` kernels as tunables, steered by the harness without editing the kernel.

Which kernels, and their fields: harness.tuning.autotuned (AutotunedKernel, autotuned_kernels).

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
import math
import os
import time
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any, Iterator

from harness import tuning
from harness.tuning import gpu_lock
from harness.tuning.autotuned import _DECLARED, _MISSING, AutotunedKernel, _fmt, _name


def interpreted() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# -- steering, per case ------------------------------------------------------------------------

@contextmanager
def _swapped(obj, attr: str, value) -> Iterator[None]:
    """`obj.attr` set to `value` for the block; its own attribute (or none) again after it."""
    old = obj.__dict__.get(attr, _MISSING)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        if old is _MISSING:
            obj.__dict__.pop(attr, None)
        else:
            setattr(obj, attr, old)


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
                    self.compile_only = True
                    return self._launch_once(orig_bench, args, config, meta)
                if tuning.in_setup():  # outside the measured call: the first that launches
                    self._setup_benched = True
                    if self._setup_launched:  # the others are neither launched nor timed
                        return [float("inf")] * 3
                    res = self._launch_once(orig_bench, args, config, meta)
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
            try:
                with _swapped(at, "cache_results", False) if untimed else nullcontext():
                    out = orig_run(*args, **kwargs)
            finally:
                if self._setup_benched:  # an untimed set-up pick: never kept for a measured
                    self.cache.pop(self.cache.last, None)  # call, even if this one raised
            if not (self._setup_benched or tuning.in_setup()):  # the measured call's only
                cfg = getattr(at, "best_config", None)
                self.used[self.cache.last] = cfg if cfg is not None else configs[0]
            return out

        self._set("run", run)
        return self

    def _launch_once(self, orig_bench, args, config, meta):
        """Compile-ahead and set-up: the autotuner's `_bench` with a do_bench that launches the
        config once (so it compiles) and times nothing; every config ties, the first is kept."""
        once = lambda kernel_call, quantiles=None, **_: (kernel_call(), [0.0] * 3)[1]  # noqa: E731
        with _swapped(self.at, "do_bench", once):
            return orig_bench(*args, config=config, **meta)

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
