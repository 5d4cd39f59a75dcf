"""The roofline's calibration measured before a run's end (calibrate.Measurement, Runner.gpu_idle):
started once, on the first GPU done with the run; what it measured kept when it ran on a GPU
of the run's model, measured again after the run otherwise. The measurement itself needs a
GPU (`harness calibrate`); here its subprocess fails on the CPU, as it must."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from rich.console import Console

from harness import store
from harness.execute import calibrate
from harness.execute.runner import Runner
from harness.machine import env
from harness.execute.timing import TIMING_METHOD

H100 = "NVIDIA H100 80GB HBM3"


def _data(name: str, gbps: float) -> dict:
    return {"copy_gbps": gbps, "copy_curve": [[8 << 20, gbps / 2]], "gpu_name": name,
            "matmul_tflops": {"float16": 700.0, "bfloat16": 700.0}, "fma_tflops_fp32": 60.0,
            "timing_method": TIMING_METHOD}


@pytest.fixture
def gpu_here(monkeypatch):
    monkeypatch.setattr(env, "cuda_device_present", lambda: (True, ""))
    monkeypatch.setattr(env, "fingerprint", lambda device: {"gpu_name": H100, "driver": "580"})
    runs = []

    def measured_now(gpu):  # the measurement after the run: its own numbers
        runs.append(gpu)
        return _early(0, _data(H100, 3000.0))

    monkeypatch.setattr(calibrate, "Measurement", measured_now)
    return runs


def _early(rc, data):
    return SimpleNamespace(result=lambda: (rc, data, "" if rc == 0 else "RuntimeError: x"))


def test_an_early_measurement_of_the_runs_gpu_model_is_kept(tmp_path, gpu_here):
    console = Console(file=open("/dev/null", "w"))
    cal = calibrate.calibrate(tmp_path, console, _early(0, _data(H100, 3100.0)))
    assert cal["copy_gbps"] == 3100.0 and not gpu_here  # nothing measured after the run
    assert store.load_calibration(H100, tmp_path)["driver"] == "580"


@pytest.mark.parametrize("rc, data", [(0, _data("NVIDIA H200", 4200.0)), (1, None)])
def test_an_early_measurement_elsewhere_or_failed_is_measured_again(tmp_path, gpu_here, rc,
                                                                    data):
    console = Console(file=open("/dev/null", "w"))
    cal = calibrate.calibrate(tmp_path, console, _early(rc, data))
    assert cal["copy_gbps"] == 3000.0 and len(gpu_here) == 1


def test_start_early_only_without_a_usable_cached_calibration(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(calibrate, "Measurement", lambda gpu: started.append(gpu) or "early")
    store.save_calibration(tmp_path, H100, _data(H100, 3000.0))
    assert calibrate.start_early(tmp_path, H100, 1) is None
    store.save_calibration(tmp_path, H100, {**_data(H100, 3000.0), "timing_method": "old"})
    assert calibrate.start_early(tmp_path, H100, 1) == "early" and started == [1]
    assert calibrate.start_early(tmp_path, None, 1) is None


def test_gpu_idle_starts_one_measurement_for_the_run(tmp_path, monkeypatch):
    """Two GPUs done with the run, from two threads: one measurement, on the first."""
    started = []
    monkeypatch.setattr(calibrate, "start_early",
                        lambda root, name, gpu: started.append((name, gpu)) or "early")
    r = SimpleNamespace(device="cuda", _calibration=None, _idle_lock=threading.Lock(),
                        run_dir=tmp_path / "run", manifest={"env": {"gpu_name": H100}})
    threads = [threading.Thread(target=Runner.gpu_idle, args=(r, g)) for g in (1, 0)]
    for t in threads:
        t.start()
        t.join()
    assert started == [(H100, 1)] and r._calibration == "early"
    cpu = SimpleNamespace(**{**vars(r), "device": "cpu", "_calibration": None})
    Runner.gpu_idle(cpu, 0)
    assert cpu._calibration is None and len(started) == 1

    def broken(root, name, gpu):
        raise OSError("no such file")

    monkeypatch.setattr(calibrate, "start_early", broken)  # never the profiler pass's fault
    r._calibration = None
    Runner.gpu_idle(r, 0)
    assert r._calibration is False  # finish() measures as before


def test_an_early_measurement_without_a_gpu_fails_in_its_own_process(tmp_path):
    """The real subprocess on this GPU-less machine: it exits non-zero, with its error's last
    line, and leaves no measurement (calibrate then measures again, and says why it cannot)."""
    rc, data, tail = calibrate.Measurement(None).result()
    assert rc != 0 and data is None and tail
