"""Provenance of a case: which code ran (`code_hash`) and what it compiled to (`compiled`).

code_hash   12 hex chars of sha256 over the impl function's module source, the source of
            every Triton kernel reachable from it: the `triton.jit` functions (also behind
            `triton.autotune` / `triton.heuristics` wrappers: `.fn`) referenced in that module
            and, transitively, in the modules of the same top-level package it uses, and the
            whole source of each such kernel's module (its launch-config lists, host helpers).
            General: no per-kernel table. Names of modules do not enter the hash, only sources.
compiled    GPU only: one extra call of the impl with Triton's launch_enter_hook set records the
            launched kernel handles; they are matched to the CompiledKernel objects in the
            kernel caches of those reachable JITFunctions and described as
            {kernel, registers, spills, shared_bytes, num_warps, num_stages, constexprs,
             launches}. Written defensively across Triton versions (3.6 on the GPU box, 3.9 in
            CI): a missing attribute drops that field, never the case.
autotune    `autotune_picks`: the chosen config of reachable `triton.autotune` kernels.
"""
from __future__ import annotations

import hashlib
import inspect
import sys
from types import ModuleType
from typing import Any, Callable, Iterable

# the package prefix under which harness.execute.code_tree imports another commit's code
# (`_kltree_<sha12>.kernels.softmax`)
TREE_PREFIX = "_kltree_"


def _kernel_interface():
    try:
        from triton.runtime.jit import KernelInterface
    except ImportError:  # no Triton: nothing is reachable
        return None
    return KernelInterface


def unwrap(obj):
    """The innermost jit function of an autotune/heuristics wrapper chain."""
    ki = _kernel_interface()
    while ki is not None and isinstance(getattr(obj, "fn", None), ki):
        obj = obj.fn
    return obj


def _top(modname: str) -> str:
    """The top-level package of a module name; for another commit's code imported by
    harness.execute.code_tree (`_kltree_<sha>.kernels.softmax`), the package under that prefix, so a
    version's kernels are found (and hashed) as the working tree's would be."""
    parts = modname.split(".")
    return ".".join(parts[:2]) if parts[0].startswith(TREE_PREFIX) and len(parts) > 1 else parts[0]


def reachable(fn: Callable) -> tuple[ModuleType | None, list[tuple[str, Any, Any]]]:
    """(the impl's module, [(qualified name, wrapper as found, inner jit function)]) for every
    Triton kernel reachable from `fn`'s module through modules of its top-level package."""
    modname = getattr(fn, "__module__", None)
    module = sys.modules.get(modname) if modname else None
    ki = _kernel_interface()
    if module is None:
        return None, []
    top = _top(modname)
    found: dict[int, tuple[str, Any, Any]] = {}
    seen: set[str] = set()
    stack = [module]
    while stack:
        m = stack.pop()
        if m.__name__ in seen:
            continue
        seen.add(m.__name__)
        for obj in list(vars(m).values()):
            if ki is not None and isinstance(obj, ki):
                inner = unwrap(obj)
                py = getattr(inner, "fn", inner)
                name = getattr(py, "__qualname__", getattr(py, "__name__", repr(py)))
                found.setdefault(id(inner), (name, obj, inner))
                owner = getattr(py, "__module__", None)
            elif isinstance(obj, ModuleType):
                owner = obj.__name__
            else:
                owner = getattr(obj, "__module__", None) if (inspect.isfunction(obj) or
                                                              inspect.isclass(obj)) else None
            if isinstance(owner, str) and _top(owner) == top and owner not in seen:
                sub = sys.modules.get(owner)
                if sub is not None:
                    stack.append(sub)
    return module, sorted(found.values(), key=lambda t: t[0])


def _source(obj) -> str:
    src = getattr(obj, "src", None)
    if isinstance(src, str) and src:
        return src
    py = getattr(obj, "fn", obj)
    try:
        return inspect.getsource(py)
    except (OSError, TypeError):  # defined where no source file exists
        return getattr(py, "__qualname__", repr(py))


def code_hash(fn: Callable) -> str:
    """12 hex chars identifying the impl's code (see the module docstring)."""
    h = hashlib.sha256()
    module, kernels = reachable(fn)
    if module is not None:
        try:
            h.update(inspect.getsource(module).encode())
        except (OSError, TypeError):  # a module without a source file: its name stands in
            h.update(module.__name__.encode())
    else:
        h.update(_source(fn).encode())
    seen = {module.__name__} if module is not None else set()
    for name, _, inner in kernels:
        h.update(b"\0" + name.encode() + b"\0" + _source(inner).encode())
        py = getattr(inner, "fn", inner)  # the kernel's own file: its launch configs, helpers
        home = sys.modules.get(getattr(py, "__module__", None) or "")
        if home is not None and home.__name__ not in seen:
            seen.add(home.__name__)
            try:
                h.update(b"\0" + inspect.getsource(home).encode())
            except (OSError, TypeError):
                pass
    return h.hexdigest()[:12]


def autotune_picks(fn: Callable) -> dict[str, dict]:
    """{kernel: config kwargs} of reachable `triton.autotune` kernels that have chosen."""
    _, kernels = reachable(fn)
    out = {}
    for name, wrapper, _ in kernels:
        obj = wrapper
        while obj is not None:
            best = getattr(obj, "best_config", None)
            if best is not None:
                kw = getattr(best, "all_kwargs", None)
                out[name] = dict(kw() if callable(kw) else getattr(best, "kwargs", {}))
                break
            obj = getattr(obj, "fn", None)
    return out


# -- compiled kernels (GPU) ----------------------------------------------------------------------

def _compiled_objects(kernels: Iterable[tuple[str, Any, Any]]) -> list[tuple[str, Any]]:
    """(kernel name, CompiledKernel) in the device caches of these jit functions."""
    out = []
    for name, _, inner in kernels:
        caches = getattr(inner, "device_caches", None)
        if not caches:
            continue
        for entry in list(caches.values()):
            cache = entry[0] if isinstance(entry, tuple) and entry else None
            if isinstance(cache, dict):
                out.extend((name, ck) for ck in cache.values())
    return out


def _constexprs(ck) -> dict[str, Any]:
    src = getattr(ck, "src", None)
    consts = getattr(src, "constants", None) or getattr(src, "constexprs", None) or {}
    names = list(getattr(getattr(src, "fn", None), "arg_names", []) or [])
    out = {}
    for k, v in dict(consts).items():
        idx = k[0] if isinstance(k, tuple) and len(k) == 1 else k
        key = names[idx] if isinstance(idx, int) and idx < len(names) else str(k)
        if isinstance(v, (bool, int, float, str)) or v is None:
            out[key] = v
        else:
            out[key] = str(v)
    return out


def describe(ck, name: str | None = None) -> dict[str, Any]:
    """One `compiled` entry; fields whose attribute is missing are left out."""
    md = getattr(ck, "metadata", None)
    entry: dict[str, Any] = {"kernel": name or getattr(ck, "name", None) or
                             getattr(md, "name", None)}
    for key, obj, attr in (("registers", ck, "n_regs"), ("spills", ck, "n_spills"),
                           ("shared_bytes", md, "shared"), ("num_warps", md, "num_warps"),
                           ("num_stages", md, "num_stages")):
        v = getattr(obj, attr, None) if obj is not None else None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            entry[key] = int(v)
    consts = _constexprs(ck)
    if consts:
        entry["constexprs"] = consts
    return entry


def match_launches(launches: list[dict], compiled: list[tuple[str, Any]]) -> list[dict]:
    """Launch records ({name, function}) -> one entry per distinct kernel launched, in order,
    with `launches` counted. A launch whose handle is in no reachable cache keeps its name."""
    by_handle = {getattr(ck, "function", None): (n, ck) for n, ck in compiled
                 if getattr(ck, "function", None) is not None}
    entries: dict[Any, dict] = {}
    for rec in launches:
        hit = by_handle.get(rec.get("function"))
        key = id(hit[1]) if hit else ("name", rec.get("name"))
        if key not in entries:
            entries[key] = describe(hit[1], hit[0]) if hit else {"kernel": rec.get("name")}
            entries[key]["launches"] = 0
        entries[key]["launches"] += 1
    return list(entries.values())


class _LaunchRecorder:
    """Triton's launch_enter_hook for the duration of a `with` block (HookChain in newer
    Triton, a plain attribute in older ones)."""

    def __init__(self) -> None:
        self.launches: list[dict] = []
        self.knobs = None
        self.old = None

    def __call__(self, metadata) -> None:
        data = metadata.get() if hasattr(metadata, "get") and callable(metadata.get) else {}
        if isinstance(data, dict):
            self.launches.append({"name": data.get("name"), "function": data.get("function")})

    def __enter__(self):
        import triton

        knobs = getattr(getattr(triton, "knobs", None), "runtime", None)
        if knobs is None or not hasattr(knobs, "launch_enter_hook"):
            return self
        self.knobs = knobs
        chain = knobs.launch_enter_hook
        if hasattr(chain, "add") and hasattr(chain, "remove"):
            chain.add(self)
        else:
            self.old = chain
            knobs.launch_enter_hook = self
        return self

    def __exit__(self, *exc) -> None:
        if self.knobs is None:
            return
        chain = self.knobs.launch_enter_hook
        if chain is self:
            self.knobs.launch_enter_hook = self.old
        elif hasattr(chain, "remove"):
            chain.remove(self)


def compiled_kernels(call: Callable[[], Any], fn: Callable, sync: Callable[[], None]
                     ) -> list[dict]:
    """Run `call()` once (outside any timing or NVTX range) recording the Triton kernels it
    launches; describe each from the caches of the kernels reachable from impl function `fn`."""
    with _LaunchRecorder() as rec:
        call()
        sync()
    if not rec.launches:
        return []
    _, kernels = reachable(fn)
    return match_launches(rec.launches, _compiled_objects(kernels))


def compiled_record(call: Callable[[], Any], fn: Callable, sync: Callable[[], None]) -> dict:
    """compiled_kernels as a timed case's record fields: provenance never fails the case, so
    an error leaves {"compiled": None, "compiled_error": why}."""
    try:
        return {"compiled": compiled_kernels(call, fn, sync)}
    except Exception as exc:
        from harness.errors import exception_line

        return {"compiled": None, "compiled_error": exception_line(exc, 500)}
