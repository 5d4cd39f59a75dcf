"""harness.nvml: the in-process GPU state reader the worker uses instead of one nvidia-smi per
case. The library is faked at the ctypes boundary (this machine has no NVIDIA driver)."""
import ctypes

import pytest

from harness import nvml, worker


class FakeNvml:
    """The five NVML entry points the reader calls, writing through the byref pointers."""

    def __init__(self, init_rc=0, clock_rc=0, gpus=("NVIDIA H200", "NVIDIA H200")):
        self.init_rc, self.clock_rc, self.gpus = init_rc, clock_rc, gpus
        self.inits = 0

    def nvmlInit_v2(self):
        self.inits += 1
        return self.init_rc

    def nvmlDeviceGetHandleByIndex_v2(self, index, handle_ref):
        if index.value >= len(self.gpus):
            return 2  # NVML_ERROR_INVALID_ARGUMENT
        handle_ref._obj.value = 1000 + index.value
        return 0

    def nvmlDeviceGetName(self, handle, buf, length):
        name = self.gpus[handle.value - 1000].encode()
        ctypes.memmove(buf, name, len(name))
        return 0

    def nvmlDeviceGetClockInfo(self, handle, clock, val_ref):
        val_ref._obj.value = {nvml.NVML_CLOCK_SM: 1980, nvml.NVML_CLOCK_MEM: 3201}[clock.value]
        return self.clock_rc

    def nvmlDeviceGetTemperature(self, handle, sensor, val_ref):
        val_ref._obj.value = 41 + handle.value - 1000
        return 0


@pytest.fixture(autouse=True)
def _fresh():
    nvml.reset()
    yield
    nvml.reset()


def test_reads_name_clocks_and_temperature_of_the_asked_gpu():
    lib = FakeNvml()
    assert nvml.gpu_state(1, loader=lambda name: lib) == {
        "gpu_name": "NVIDIA H200", "sm_clock_mhz": 1980.0, "mem_clock_mhz": 3201.0,
        "gpu_temp_c": 42.0}
    nvml.gpu_state(0, loader=lambda name: lib)
    assert lib.inits == 1  # initialised once per process


def test_a_failing_query_is_none_not_a_wrong_number():
    lib = FakeNvml(clock_rc=3)
    state = nvml.gpu_state(0, loader=lambda name: lib)
    assert state["sm_clock_mhz"] is None and state["gpu_temp_c"] == 41.0
    assert nvml.gpu_state(5, loader=lambda name: lib) is None  # no such GPU


def test_no_library_or_failed_init_is_none():
    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    assert nvml.gpu_state(0, loader=missing) is None
    nvml.reset()
    assert nvml.gpu_state(0, loader=lambda name: FakeNvml(init_rc=9)) is None


def test_worker_falls_back_to_nvidia_smi_without_nvml(monkeypatch):
    monkeypatch.setattr(nvml, "gpu_state", lambda index: None)
    calls = []

    def smi(index=None, timeout=10.0):
        calls.append(index)
        return [{"gpu_name": "NVIDIA H100", "sm_clock_mhz": 1755.0, "mem_clock_mhz": 2619.0,
                 "gpu_temp_c": 35.0, "driver": "580"}]

    monkeypatch.setattr("harness.env.query_gpus", smi)
    assert worker.gpu_state(1) == {"gpu_name": "NVIDIA H100", "sm_clock_mhz": 1755.0,
                                   "mem_clock_mhz": 2619.0, "gpu_temp_c": 35.0}
    assert calls == [1]
    monkeypatch.setattr("harness.env.query_gpus", lambda index=None, timeout=10.0: [])
    assert worker.gpu_state(0) == {}


def test_worker_prefers_nvml(monkeypatch):
    monkeypatch.setattr(nvml, "gpu_state", lambda index: {"gpu_name": "X", "sm_clock_mhz": 1.0,
                                                          "mem_clock_mhz": 2.0,
                                                          "gpu_temp_c": 3.0})
    monkeypatch.setattr("harness.env.query_gpus", lambda **kw: pytest.fail("nvidia-smi called"))
    assert worker.gpu_state(0)["gpu_name"] == "X"


def test_sm_clock_is_the_reading_of_the_asked_gpu_or_none():
    lib = FakeNvml()
    assert nvml.sm_clock(1, loader=lambda name: lib) == 1980.0
    assert nvml.sm_clock(5, loader=lambda name: lib) is None  # no such GPU
    nvml.reset()
    assert nvml.sm_clock(0, loader=lambda name: FakeNvml(clock_rc=3)) is None
    nvml.reset()

    def missing(name):
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")
    assert nvml.sm_clock(0, loader=missing) is None


def test_the_clock_under_load_is_the_median_of_the_batch_readings():
    from harness.timing import Samples

    assert Samples((1.0, 1.1), "cuda_events", (1815.0, 1830.0, 1965.0)).summary()[
        "sm_clock_timed_mhz"] == 1830.0
    assert Samples((1.0,), "cpu_wall").summary()["sm_clock_timed_mhz"] is None
