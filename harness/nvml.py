"""A GPU's state (name, SM/memory clocks, temperature) read in-process through NVML.

The worker records this for every check/time case. nvidia-smi costs a process start per
reading (tens of ms; 20 s over a 280-case sweep of two passes); NVML, the library nvidia-smi
itself reads, answers in microseconds. NVML is not CUDA: it is safe in a worker wrapped by ncu.
NVML numbers GPUs in PCI bus order, as nvidia-smi and CUDA_DEVICE_ORDER=PCI_BUS_ID do.
`gpu_state` returns None where NVML cannot be loaded or answers an error; callers fall back
to nvidia-smi.
"""
from __future__ import annotations

import ctypes

NVML_SUCCESS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
NAME_LEN = 96

_lib = None  # the loaded library, False once loading failed
_handles: dict[int, ctypes.c_void_p] = {}


def _load(loader=ctypes.CDLL):
    global _lib
    if _lib is None:
        try:
            lib = loader("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != NVML_SUCCESS:
                raise OSError("nvmlInit_v2 failed")
            _lib = lib
        except (OSError, AttributeError):
            _lib = False
    return _lib or None


def gpu_state(index: int, loader=ctypes.CDLL) -> dict | None:
    """{gpu_name, sm_clock_mhz, mem_clock_mhz, gpu_temp_c} of GPU `index`, or None."""
    lib = _load(loader)
    if lib is None:
        return None
    handle = _handle(lib, index)
    if handle is None:
        return None
    try:
        name = ctypes.create_string_buffer(NAME_LEN)
        if lib.nvmlDeviceGetName(handle, name, ctypes.c_uint(NAME_LEN)) != NVML_SUCCESS:
            return None
        out = {"gpu_name": name.value.decode(errors="replace"),
               "sm_clock_mhz": _clock(lib, handle, NVML_CLOCK_SM),
               "mem_clock_mhz": _clock(lib, handle, NVML_CLOCK_MEM)}
        temp = ctypes.c_uint()
        ok = lib.nvmlDeviceGetTemperature(handle, ctypes.c_int(NVML_TEMPERATURE_GPU),
                                          ctypes.byref(temp))
        out["gpu_temp_c"] = float(temp.value) if ok == NVML_SUCCESS else None
        return out
    except (OSError, AttributeError, ValueError):
        return None


def sm_clock(index: int, loader=ctypes.CDLL) -> float | None:
    """The SM clock of GPU `index` now (MHz), or None: read while a batch of timed samples
    runs (harness.timing's clock_probe)."""
    lib = _load(loader)
    handle = _handle(lib, index) if lib is not None else None
    if handle is None:
        return None
    try:
        return _clock(lib, handle, NVML_CLOCK_SM) or None
    except (OSError, AttributeError, ValueError):
        return None


def _clock(lib, handle, which: int) -> float | None:
    """One clock of a GPU in MHz (NVML_CLOCK_SM / NVML_CLOCK_MEM), None when NVML says no."""
    val = ctypes.c_uint()
    ok = lib.nvmlDeviceGetClockInfo(handle, ctypes.c_int(which), ctypes.byref(val))
    return float(val.value) if ok == NVML_SUCCESS else None


def _handle(lib, index: int):
    if index not in _handles:
        handle = ctypes.c_void_p()
        try:
            ok = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle))
        except (OSError, AttributeError, ValueError):
            return None
        if ok != NVML_SUCCESS:
            return None
        _handles[index] = handle
    return _handles[index]


def reset() -> None:
    """Forget the loaded library and handles (tests)."""
    global _lib
    _lib = None
    _handles.clear()
