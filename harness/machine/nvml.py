"""A GPU's state (name, SM/memory clocks, temperature) read in-process through NVML, with
NVIDIA's own binding (`nvidia-ml-py`, imported as `pynvml`).

The worker records this for every check/time case. nvidia-smi costs a process start per
reading (tens of ms; 20 s over a 280-case sweep of two passes); NVML, the library nvidia-smi
itself reads, answers in microseconds. NVML is not CUDA: it is safe in a worker wrapped by ncu.
NVML numbers GPUs in PCI bus order, as nvidia-smi and CUDA_DEVICE_ORDER=PCI_BUS_ID do.
`gpu_state` and `sm_clock` return None where the binding is not installed, the driver's
library cannot be loaded, or NVML answers an error; callers fall back to nvidia-smi.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Callable

_nvml: ModuleType | None | bool = None  # the initialised binding, False once it failed
_handles: dict[int, object] = {}


def _import() -> ModuleType:
    return importlib.import_module("pynvml")


def _load(loader: Callable[[], ModuleType] = _import):
    """The binding, initialised once per process; None where it cannot be."""
    global _nvml
    if _nvml is None:
        try:
            mod = loader()
            mod.nvmlInit()
            _nvml = mod
        except Exception:  # ImportError, NVMLError_LibraryNotFound / _DriverNotLoaded, ...
            _nvml = False
    return _nvml or None


def _device(index: int, loader: Callable[[], ModuleType]):
    """(the binding, GPU `index`'s handle), or (None, None) where NVML cannot say."""
    nv = _load(loader)
    handle = _handle(nv, index) if nv is not None else None
    return (nv, handle) if handle is not None else (None, None)


def gpu_state(index: int, loader: Callable[[], ModuleType] = _import) -> dict | None:
    """{gpu_name, sm_clock_mhz, mem_clock_mhz, gpu_temp_c} of GPU `index`, or None."""
    nv, handle = _device(index, loader)
    if handle is None:
        return None
    try:
        name = nv.nvmlDeviceGetName(handle)
    except nv.NVMLError:
        return None
    if isinstance(name, bytes):  # older bindings return bytes
        name = name.decode(errors="replace")
    out = {"gpu_name": name, "sm_clock_mhz": _clock(nv, handle, nv.NVML_CLOCK_SM),
           "mem_clock_mhz": _clock(nv, handle, nv.NVML_CLOCK_MEM)}
    try:
        out["gpu_temp_c"] = float(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU))
    except nv.NVMLError:
        out["gpu_temp_c"] = None
    return out


def sm_clock(index: int, loader: Callable[[], ModuleType] = _import) -> float | None:
    """The SM clock of GPU `index` now (MHz), or None: read while a batch of timed samples
    runs (harness.execute.timing's clock_probe)."""
    nv, handle = _device(index, loader)
    if handle is None:
        return None
    return _clock(nv, handle, nv.NVML_CLOCK_SM) or None


def free_bytes(index: int, loader: Callable[[], ModuleType] = _import) -> int | None:
    """The memory free on GPU `index` now (bytes), or None."""
    nv, handle = _device(index, loader)
    if handle is None:
        return None
    try:
        return int(nv.nvmlDeviceGetMemoryInfo(handle).free)
    except nv.NVMLError:
        return None


def _clock(nv, handle, which) -> float | None:
    """One clock of a GPU in MHz (NVML_CLOCK_SM / NVML_CLOCK_MEM), None when NVML says no."""
    try:
        return float(nv.nvmlDeviceGetClockInfo(handle, which))
    except nv.NVMLError:
        return None


def _handle(nv, index: int):
    if index not in _handles:
        try:
            _handles[index] = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError:
            return None
    return _handles[index]


def reset() -> None:
    """Forget the loaded binding and handles (tests)."""
    global _nvml
    _nvml = None
    _handles.clear()
