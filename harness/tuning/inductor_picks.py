"""Inductor's choice between a kernel's configs, made once per host and cache folder.

Inductor compiles a reduction with one heuristic config, and on the GPU `_dynamic_scale_rblock`
may add a second one with half the R0_BLOCK when registers limit occupancy; the kernel's first
call then benchmarks both. Inductor means to cache that choice (`autotune_local_cache`), but
for these kernels it cannot: the cache is keyed on the one original config
(pytorch/pytorch#189121, fixed after torch 2.11). So every process that calls a torch.compile
graph benchmarks its reductions again: 24 s of flash_bwd.yaml's cold check process on an H200,
29 s of the time pass's second process, and as much in the ncu and nsys processes. Worse for a
measurement, near-tied configs flip from process to process, so two processes of one run could
time different kernels for the same case.

`install()` (every GPU worker) wraps Inductor's CachingAutotuner:

- `benchmark_all_configs`: the timings a process measured are written to
  `<inductor cache>/kernel-lab-picks/<key>.json` (key: the generated kernel file, which names
  its source's hash, its configs, the GPU, torch and triton); a later process, or the next
  run with the same cache folder, reads them instead of benchmarking, so every process
  launches the same config. The benchmark takes the run's GPU lock exclusively when no other
  process holds it (harness.tuning.gpu_lock.try_exclusive); the file says whether it did.
- `autotune_to_one_config` under `harness.tuning.compile_only()` (compile-ahead, the time
  pass's prewarm): with no stored choice, the call launches the first config and keeps all of
  them, choosing nothing: a process that only warms caches, beside other work on the GPU, does
  not benchmark, and does not fix this process's choice before it measures.

`HARNESS_INDUCTOR_PICKS=0` leaves Inductor as it is. Without torch's Inductor, or with one whose
autotuner lacks these methods, nothing is wrapped.
"""
from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
from pathlib import Path

ENV = "HARNESS_INDUCTOR_PICKS"
MODULE = "torch._inductor.runtime.triton_heuristics"
FOLDER = "kernel-lab-picks"
_installed = {"hook": False, "patched": False}
_lock = threading.Lock()
counts = {"reused": 0, "benchmarked": 0, "deferred": 0}


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def install() -> None:
    """Wrap Inductor's autotuner now if it is imported, else as soon as it is (an import hook:
    importing it here would cost a process that never compiles a second or more)."""
    if not enabled() or _installed["hook"]:
        return
    _installed["hook"] = True
    if MODULE in sys.modules:
        _patch(sys.modules[MODULE])
    else:
        sys.meta_path.insert(0, _Finder())


class _Finder(importlib.abc.MetaPathFinder):
    """Patches MODULE once its own loader has executed it (then leaves sys.meta_path)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != MODULE:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def _patch(module) -> None:
    with _lock:
        if _installed["patched"]:
            return
        cls = getattr(module, "CachingAutotuner", None)
        if cls is None or not all(hasattr(cls, m) for m in
                                  ("benchmark_all_configs", "autotune_to_one_config", "run")):
            return
        _installed["patched"] = True
        bench, to_one = cls.benchmark_all_configs, cls.autotune_to_one_config

        def benchmark_all_configs(self, *args, **kwargs):
            return measured_or_stored(self, lambda: bench(self, *args, **kwargs))

        def autotune_to_one_config(self, *args, **kwargs):
            if _compile_only() and len(self.launchers) > 1 and stored(self) is None:
                return defer(self)
            return to_one(self, *args, **kwargs)

        cls.benchmark_all_configs = benchmark_all_configs
        cls.autotune_to_one_config = autotune_to_one_config


def defer(autotuner) -> None:
    """Choose nothing: this call (Inductor's `run`, which goes on to launch `launchers[0]` once
    one is left) launches the first config, and every config is back before the next call,
    which chooses if it measures. Only that next call goes through a wrapper (an attribute of
    the instance, gone as it starts): steady-state launches pay nothing."""
    every = autotuner.launchers
    autotuner.launchers = every[:1]
    counts["deferred"] += 1
    run = type(autotuner).run

    def restore_then_run(*args, **kwargs):
        autotuner.__dict__.pop("run", None)
        autotuner.launchers = every
        if hasattr(autotuner, "_cached_launcher"):  # torch's fast path kept the first config
            autotuner._cached_launcher = None
        return run(autotuner, *args, **kwargs)

    autotuner.run = restore_then_run


def _compile_only() -> bool:
    from harness import tuning

    return tuning.compiling_only()


# -- the stored choices ----------------------------------------------------------------------------

def folder() -> Path | None:
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        return Path(cache_dir()) / FOLDER
    except Exception:
        d = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        return Path(d) / FOLDER if d else None


def config_name(config) -> str:
    return str(config)


def key(autotuner) -> str | None:
    """The identity of an autotuner's choice: its generated file (named by its source's hash),
    its configs, the GPU and the versions that compiled it. None: not to be stored."""
    filename = getattr(autotuner, "filename", None)
    launchers = getattr(autotuner, "launchers", None) or []
    if not filename or len(launchers) < 2:
        return None
    names = sorted(config_name(lc.config) for lc in launchers)
    return key_of(os.path.basename(str(filename)), names, _device_tag())


def key_of(filename: str, config_names: list[str], device: str) -> str:
    blob = json.dumps([filename, sorted(config_names), device])
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _device_tag() -> str:
    import torch

    try:
        import triton

        tv = triton.__version__
    except Exception:
        tv = "?"
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return f"{name}|torch {torch.__version__}|triton {tv}"


def read(k: str) -> dict | None:
    base = folder()
    if base is None:
        return None
    try:
        return json.loads((base / f"{k}.json").read_text())
    except (OSError, ValueError):
        return None


def write(k: str, record: dict) -> None:
    base = folder()
    if base is None:
        return
    try:
        base.mkdir(parents=True, exist_ok=True)
        tmp = base / f".{k}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, base / f"{k}.json")
    except OSError:  # a read-only cache folder: the next process benchmarks, as Inductor does
        pass


def stored(autotuner) -> dict | None:
    """{launcher: ms} from a stored choice covering every launcher of `autotuner`, or None."""
    k = key(autotuner)
    rec = read(k) if k else None
    if not rec:
        return None
    ms = rec.get("ms") or {}
    out = {}
    for lc in autotuner.launchers:
        v = ms.get(config_name(lc.config))
        if v is None:
            return None
        out[lc] = float(v)
    return out


def measured_or_stored(autotuner, benchmark) -> dict:
    """The stored timings of `autotuner`'s launchers, or `benchmark()`'s (stored for the next
    process)."""
    hit = stored(autotuner)
    if hit is not None:
        counts["reused"] += 1
        return hit
    from harness.tuning import gpu_lock

    with gpu_lock.try_exclusive() as alone:
        timings = benchmark()
    counts["benchmarked"] += 1
    k = key(autotuner)
    if k:
        write(k, {"kernel": getattr(getattr(autotuner, "fn", None), "__name__", None),
                  "file": os.path.basename(str(autotuner.filename)),
                  "device": _device_tag(), "alone": alone, "pid": os.getpid(),
                  "ms": {config_name(lc.config): float(v) for lc, v in timings.items()}})
    return timings


def summary() -> str | None:
    """One line for the worker's log, or None when nothing was met."""
    if not any(counts.values()):
        return None
    return ("inductor picks: {reused} reused, {benchmarked} benchmarked, {deferred} left open "
            "(compile-only)").format(**counts)
