"""harness.machine.nvml: the in-process GPU state reader the worker uses instead of one
nvidia-smi per case, through NVIDIA's binding (nvidia-ml-py's `pynvml`). The binding is faked at
its module boundary (this machine has no NVIDIA driver); that the real one is importable and
says so without a driver is checked too."""
import pytest

from harness.machine import nvml

from harness.execute import worker


class NVMLError(Exception):
    pass


class FakeNvml:
    """The pynvml calls the reader makes: handles, name, clocks, temperature; errors raise
    NVMLError as the binding does."""
    NVMLError = NVMLError
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, init_ok=True, clock_ok=True, gpus=("NVIDIA H200", "NVIDIA H200"),
                 name_bytes=False):
        self.init_ok, self.clock_ok, self.gpus = init_ok, clock_ok, gpus
        self.name_bytes = name_bytes
        self.inits = 0

    def nvmlInit(self):
        self.inits += 1
        if not self.init_ok:
            raise NVMLError("Driver Not Loaded")

    def nvmlDeviceGetHandleByIndex(self, index):
        if index >= len(self.gpus):
            raise NVMLError("Invalid Argument")
        return ("handle", index)

    def nvmlDeviceGetName(self, handle):
        name = self.gpus[handle[1]]
        return name.encode() if self.name_bytes else name

    def nvmlDeviceGetClockInfo(self, handle, clock):
        if not self.clock_ok:
            raise NVMLError("Not Supported")
        return {self.NVML_CLOCK_SM: 1980, self.NVML_CLOCK_MEM: 3201}[clock]

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 41 + handle[1]

    def nvmlDeviceGetMemoryInfo(self, handle):
        if not self.clock_ok:
            raise NVMLError("Not Supported")
        return type("Memory", (), {"free": (3 + handle[1]) << 30, "total": 80 << 30})()


@pytest.fixture(autouse=True)
def _fresh():
    nvml.reset()
    yield
    nvml.reset()


def test_reads_name_clocks_and_temperature_of_the_asked_gpu():
    lib = FakeNvml()
    assert nvml.gpu_state(1, loader=lambda: lib) == {
        "gpu_name": "NVIDIA H200", "sm_clock_mhz": 1980.0, "mem_clock_mhz": 3201.0,
        "gpu_temp_c": 42.0}
    nvml.gpu_state(0, loader=lambda: lib)
    assert lib.inits == 1  # initialised once per process
    nvml.reset()
    old = FakeNvml(name_bytes=True)  # bindings before 11.5 return the name as bytes
    assert nvml.gpu_state(0, loader=lambda: old)["gpu_name"] == "NVIDIA H200"


def test_a_failing_query_is_none_not_a_wrong_number():
    lib = FakeNvml(clock_ok=False)
    state = nvml.gpu_state(0, loader=lambda: lib)
    assert state["sm_clock_mhz"] is None and state["gpu_temp_c"] == 41.0
    assert nvml.gpu_state(5, loader=lambda: lib) is None  # no such GPU


def test_no_binding_no_driver_or_failed_init_is_none():
    def missing():
        raise ImportError("No module named 'pynvml'")

    assert nvml.gpu_state(0, loader=missing) is None
    nvml.reset()
    assert nvml.gpu_state(0, loader=lambda: FakeNvml(init_ok=False)) is None
    nvml.reset()
    # the real binding on this GPU-less machine: importable, and no driver -> None
    pytest.importorskip("pynvml")
    assert nvml.gpu_state(0) is None and nvml.sm_clock(0) is None


def test_worker_falls_back_to_nvidia_smi_without_nvml(monkeypatch):
    monkeypatch.setattr(nvml, "gpu_state", lambda index: None)
    calls = []

    def smi(index=None, timeout=10.0):
        calls.append(index)
        return [{"gpu_name": "NVIDIA H100", "sm_clock_mhz": 1755.0, "mem_clock_mhz": 2619.0,
                 "gpu_temp_c": 35.0, "driver": "580"}]

    monkeypatch.setattr("harness.machine.env.query_gpus", smi)
    assert worker.gpu_state(1) == {"gpu_name": "NVIDIA H100", "sm_clock_mhz": 1755.0,
                                   "mem_clock_mhz": 2619.0, "gpu_temp_c": 35.0}
    assert calls == [1]
    monkeypatch.setattr("harness.machine.env.query_gpus", lambda index=None, timeout=10.0: [])
    assert worker.gpu_state(0) == {}


def test_worker_prefers_nvml(monkeypatch):
    monkeypatch.setattr(nvml, "gpu_state", lambda index: {"gpu_name": "X", "sm_clock_mhz": 1.0,
                                                          "mem_clock_mhz": 2.0,
                                                          "gpu_temp_c": 3.0})
    monkeypatch.setattr("harness.machine.env.query_gpus",
                        lambda **kw: pytest.fail("nvidia-smi called"))
    assert worker.gpu_state(0)["gpu_name"] == "X"


def test_sm_clock_is_the_reading_of_the_asked_gpu_or_none():
    lib = FakeNvml()
    assert nvml.sm_clock(1, loader=lambda: lib) == 1980.0
    assert nvml.sm_clock(5, loader=lambda: lib) is None  # no such GPU
    nvml.reset()
    assert nvml.sm_clock(0, loader=lambda: FakeNvml(clock_ok=False)) is None
    nvml.reset()

    def missing():
        raise ImportError("No module named 'pynvml'")
    assert nvml.sm_clock(0, loader=missing) is None


def test_the_clock_under_load_is_the_median_of_the_batch_readings():
    from harness.execute.timing import Samples

    assert Samples((1.0, 1.1), "cuda_events", (1815.0, 1830.0, 1965.0)).summary()[
        "sm_clock_timed_mhz"] == 1830.0
    assert Samples((1.0,), "cpu_wall").summary()["sm_clock_timed_mhz"] is None


def test_free_memory_of_the_asked_gpu_or_none():
    lib = FakeNvml()
    assert nvml.free_bytes(1, loader=lambda: lib) == 4 << 30
    assert nvml.free_bytes(5, loader=lambda: lib) is None  # no such GPU
    nvml.reset()
    assert nvml.free_bytes(0, loader=lambda: FakeNvml(clock_ok=False)) is None
    nvml.reset()
    assert nvml.free_bytes(0, loader=lambda: FakeNvml(init_ok=False)) is None
