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
  launches the same config. The first record stays: a process that benchmarked while
  another stored its own (two GPUs of one host) takes the stored one. The benchmark takes the
  run's GPU lock exclusively if it is free within LOCK_WAIT_S
  (harness.tuning.gpu_lock.try_exclusive); the record says whether it had it (`alone`). A
  record stays until its cache folder goes: delete `<inductor cache>/kernel-lab-picks` to
  choose again.
- `benchmark_all_configs` again: a config's benchmark puts back the arguments Inductor keeps on
  the CPU (a kernel that writes a large argument in place) once, after its last call, not
  after every call (`restored_once`).
- `autotune_to_one_config` under `harness.tuning.compile_only()` (compile-ahead, the time
  pass's prewarm): with no stored choice, the call launches the first config and keeps all of
  them, choosing nothing: a process that only warms caches, beside other work on the GPU, does
  not benchmark, and does not fix this process's choice before it measures. (Coordinate-
  descent tuning, max-autotune's, is left to Inductor.)

`HARNESS_INDUCTOR_PICKS=0` leaves Inductor as it is. Without torch's Inductor, or with one whose
autotuner lacks these methods, nothing is wrapped.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator

ENV = "HARNESS_INDUCTOR_PICKS"
MODULE = "torch._inductor.runtime.triton_heuristics"
FOLDER = "kernel-lab-picks"
# How long a benchmark waits for the run's GPU lock (another process's untimed call holding it
# shared, a timed case holding it) before it runs as it is, its record saying so (`alone`).
# 0, as measured (docs/measurement.md): the check process's benchmarks meet the time pass's
# second process loading graphs under the shared lock for seconds at a time, and a wait per
# kernel was not measured against it.
LOCK_WAIT_S = 0.0
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
    """Patches MODULE once its own loader has executed it. It stays in sys.meta_path (taking
    itself out while another thread walks the list could make that thread skip a finder) and
    answers nothing once the module is patched."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != MODULE or _installed["patched"]:
            return None
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
        restores = all(callable(getattr(cls, m, None)) for m in ("bench", "restore_args_from_cpu"))

        def benchmark_all_configs(self, *args, **kwargs):
            once = restores and not _coordesc(self) and not getattr(self, "custom_kernel", False)

            def measure():
                with restored_once(self) if once else nullcontext():
                    return bench(self, *args, **kwargs)
            return measured_or_stored(self, measure)

        def autotune_to_one_config(self, *args, **kwargs):
            if _compile_only() and len(self.launchers) > 1 and not _coordesc(self) \
                    and stored(self) is None:
                return defer(self)
            return to_one(self, *args, **kwargs)

        cls.benchmark_all_configs = benchmark_all_configs
        cls.autotune_to_one_config = autotune_to_one_config


@contextmanager
def restored_once(autotuner) -> Iterator[None]:
    """Within the block, a config's benchmark (`bench`) puts back the arguments it keeps on the
    CPU once, after its last call, instead of after every call.

    A kernel that writes an argument in place is benchmarked on copies of it; where a copy
    would raise the process's peak memory, Inductor copies the argument to pinned CPU memory
    instead and copies it back after every call, inside the timed region
    (`restore_args_from_cpu`). At flash_bwd's N=16384 that argument is a 16 GiB score matrix:
    each call then carries a host-to-device copy of it, which took the check process seconds
    per kernel and timed the copy with the configs. The calls after the first then read what
    the earlier calls wrote; a config's time does not depend on the values of Inductor's own
    kernels, and the argument is whole again when the benchmark returns. Not for a user's
    Triton kernel (`custom_kernel`: its time may depend on what it overwrites) nor under
    coordinate descent (its neighbours are timed later, Inductor's way, against these
    timings)."""
    cls = type(autotuner)

    def put_back(held: list, quiet: bool = False) -> None:
        autotuner.__dict__.pop("restore_args_from_cpu", None)
        if not held:
            return
        try:  # the copies taken before this config's first call
            cls.restore_args_from_cpu(autotuner, held[0])
        except Exception:
            if not quiet:
                raise  # else the benchmark's own error goes on, not this one

    def bench(launcher, *args, **kwargs):
        held: list = []
        autotuner.restore_args_from_cpu = held.append  # every call's put-back, held
        try:
            timing = cls.bench(autotuner, launcher, *args, **kwargs)
        except BaseException:
            put_back(held, quiet=True)
            raise
        put_back(held)
        return timing

    autotuner.bench = bench
    try:
        yield
    finally:
        autotuner.__dict__.pop("bench", None)


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


def _coordesc(autotuner) -> bool:
    """Coordinate-descent tuning (max-autotune) goes on from the chosen config: left to
    Inductor, as it is, in every process."""
    meta = getattr(autotuner, "inductor_meta", None) or {}
    return bool(meta.get("coordinate_descent_tuning"))


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


@functools.lru_cache(maxsize=None)
def _device_tag() -> str:
    """The GPU and the versions a choice was made with (one per process: read once)."""
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


def write(k: str, record: dict, replace: bool = False) -> bool:
    """Store `record` unless a record is there already (the first writer wins: two processes
    that benchmarked at once, on two GPUs, then both take the first one's; `replace`: over
    one that cannot be read). False: not stored (another was first, or the folder cannot be
    written)."""
    base = folder()
    if base is None:
        return False
    tmp = base / f".{k}.{os.getpid()}.tmp"
    try:
        base.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record, indent=1))
        if replace:
            os.replace(tmp, base / f"{k}.json")
        else:
            os.link(tmp, base / f"{k}.json")  # atomic, and fails if the name exists
        return True
    except OSError:  # there already, or a read-only folder (the next process benchmarks)
        return False
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass


def stored(autotuner) -> dict | None:
    """{launcher: ms} from a stored choice covering every launcher of `autotuner`, or None
    (none, or one this code cannot read: benchmarked again, as Inductor would)."""
    try:
        k = key(autotuner)
        rec = read(k) if k else None
        ms = rec.get("ms") if isinstance(rec, dict) else None
        if not isinstance(ms, dict):
            return None
        out = {}
        for lc in autotuner.launchers:
            v = ms.get(config_name(lc.config))
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                return None
            out[lc] = float(v)
        return out
    except Exception:
        return None


def measured_or_stored(autotuner, benchmark) -> dict:
    """The stored timings of `autotuner`'s launchers, or `benchmark()`'s, stored for the next
    process; if another process stored its own meanwhile, those (one choice per host)."""
    hit = stored(autotuner)
    if hit is not None:
        counts["reused"] += 1
        return hit
    from harness.tuning import gpu_lock

    with gpu_lock.try_exclusive(wait_s=LOCK_WAIT_S) as alone:
        timings = benchmark()
    counts["benchmarked"] += 1
    k = key(autotuner)
    if k is None:
        return timings
    record = {"kernel": getattr(getattr(autotuner, "fn", None), "__name__", None),
              "file": os.path.basename(str(autotuner.filename)), "device": _device_tag(),
              "alone": alone, "pid": os.getpid(),
              "ms": {config_name(lc.config): float(v) for lc, v in timings.items()}}
    if not write(k, record):
        first = stored(autotuner)
        if first is not None:  # another process stored its choice meanwhile: that one
            return first
        write(k, record, replace=True)  # what is there cannot be read: this one instead
    return timings


def summary() -> str | None:
    """One line for the worker's log, or None when nothing was met."""
    if not any(counts.values()):
        return None
    return ("inductor picks: {reused} reused, {benchmarked} benchmarked, {deferred} left open "
            "(compile-only)").format(**counts)
