"""Finding the `triton.autotune` kernels an impl reaches, and their configs as tunables.

Most Triton kernels in the wild choose their launch config with `@triton.autotune(configs=[...],
key=[...])`. Those configs become the impl's tunables, as a `Tuner`'s fields do:

    the autotuned kernels the impl's code refers to (referenced_kernels; also behind
    `triton.heuristics`), else, for a triton/library impl, those of provenance.reachable
      -> AutotunedKernel "my_ops._swiglu_kernel": fields BLOCK_SIZE, num_warps, num_stages
         (every kwarg of its triton.Configs, then the launch options; num_ctas and maxnreg only
         where a config sets them), valid values: those its configs take
      -> Impl.tunables(): BLOCK_SIZE, num_warps, ... (`_swiglu_kernel.BLOCK_SIZE` where several
         autotuned kernels, or an unprefixed Tuner, are reachable)

Steering them for a case (forced configs, compile-ahead, set-up, evidence): harness.tuning.autotune.
"""
from __future__ import annotations

import copy
import functools
import inspect
import sys
from types import ModuleType
from typing import Any, Mapping

from harness.tuning.provenance import _kernel_interface, reachable, unwrap

LAUNCH = ("num_warps", "num_stages", "num_ctas", "maxnreg")
OPTIONAL = {"num_ctas": 1, "maxnreg": None}  # fields only where a config sets another value
_MISSING = object()
_DECLARED: dict[int, list] = {}  # id(autotuner) -> its own configs, while a block steers it


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
