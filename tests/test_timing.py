"""Timing statistics and the stopping rule (CPU clock; CUDA events are exercised on the GPU)."""
import math
import time

import pytest

from harness.execute.timing import Samples, _enough, bench, rel_stderr


def test_sample_statistics():
    s = Samples(tuple(float(i) for i in range(1, 101)), "cpu_wall")
    assert s.n == 100
    assert s.median == pytest.approx(50.5)
    assert s.p20 == pytest.approx(20.8)
    assert s.p80 == pytest.approx(80.2)
    assert s.iqr == pytest.approx(49.5)
    summary = s.summary()
    assert summary["clock"] == "cpu_wall" and summary["n_samples"] == 100


def test_rel_stderr():
    assert rel_stderr([1.0]) == math.inf
    assert rel_stderr([2.0, 2.0, 2.0]) == 0.0
    a = [1.0, 2.0, 3.0, 4.0]
    assert rel_stderr(a) == pytest.approx(1.2909944 / 2 / 2.5)


def test_stopping_rule():
    noisy = [1.0, 3.0] * 10
    assert not _enough([1.0] * 5, 0.0, 100, 10, 1000, 0.01)     # below min_samples
    assert _enough([1.0] * 10, 0.0, 100, 10, 1000, 0.01)        # precise enough
    assert not _enough(noisy, 10.0, 100, 10, 1000, 0.01)        # noisy, budget left
    assert _enough(noisy, 150.0, 100, 10, 1000, 0.01)           # budget spent
    assert _enough([1.0, 3.0] * 500, 0.0, 1e9, 10, 1000, 1e-9)  # max_samples


def test_cpu_bench_measures_the_callable():
    s = bench(lambda: time.sleep(0.002), device="cpu", warmup_ms=1, rep_ms=50, min_samples=5,
              max_samples=50, max_rel_err=1e-9)
    assert s.clock == "cpu_wall" and 5 <= s.n <= 50
    assert 1.5 < s.median < 20


def test_cpu_bench_stops_early_when_precise():
    s = bench(lambda: None, device="cpu", warmup_ms=1, rep_ms=10_000, min_samples=10,
              max_samples=100_000, max_rel_err=0.5)
    assert s.n < 100_000


def test_runs_timed_by_another_flush_are_not_compared_and_old_ceilings_are_redone(tmp_path):
    """The L2 flush reads its buffer now (a zeroing flush left dirty lines that the timed
    kernel wrote back: 8-13 % on memory-bound kernels on an H200). A GPU run recorded before
    the method was (its env has no timing_method) is not comparable with one after; CPU runs
    have no flush and no method; a calibration cached by another method is measured again."""
    from rich.console import Console

    from harness import store

    from harness.execute import calibrate
    from harness.analysis.compare import env_problems
    from harness.execute.timing import TIMING_METHOD, Flusher

    gpu = {"device": "cuda", "gpu_name": "NVIDIA H200", "driver": "580"}
    old, new = dict(gpu), {**gpu, "timing_method": TIMING_METHOD}
    assert env_problems(new, new) == []
    assert env_problems(old, new) == [
        f"timing method differs: 'l2-zero-flush (unrecorded)' vs '{TIMING_METHOD}'"]
    cpu = {"device": "cpu", "timing_method": None}
    assert env_problems(cpu, {"device": "cpu"}) == []
    assert Flusher("cpu", True).buf is None  # nothing to flush off the GPU
    Flusher("cpu", True)()
    import torch  # the flush itself, on CPU tensors: a read of the buffer into the sink

    fl = Flusher("cpu", True)
    fl.buf, fl.sink = torch.ones(1000, dtype=torch.int32), torch.empty((), dtype=torch.int64)
    fl()
    assert int(fl.sink) == 1000 and int(fl.buf.sum()) == 1000  # the buffer is only read

    store.save_calibration(tmp_path, "NVIDIA H200", {"copy_gbps": 4000.0})  # no method: old
    console = Console(record=True, width=200)
    assert calibrate.ensure(tmp_path, "NVIDIA H200", console) is None  # no GPU here to redo it
    text = console.export_text()
    assert "re-calibrating NVIDIA H200" in text and "calibration skipped" in text
    store.save_calibration(tmp_path, "NVIDIA H200", {"copy_gbps": 4000.0,
                                                     "timing_method": TIMING_METHOD})
    assert calibrate.ensure(tmp_path, "NVIDIA H200", Console())["copy_gbps"] == 4000.0


class _FakeGPU:
    """torch.cuda's events, synchronize and _sleep, and the host's clock, on one simulated
    clock: a call of the timed function moves it by the call's device time; nothing runs on
    a GPU."""

    def __init__(self, monkeypatch):
        import torch

        self.now = 0.0
        gpu = self

        class Event:
            def __init__(self, enable_timing=True):
                self.t = None

            def record(self):
                self.t = gpu.now

            def elapsed_time(self, other):
                return other.t - self.t

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
        monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
        monkeypatch.setattr("harness.execute.timing._SLEEP_CYCLES_PER_MS", 1e6)
        # the host's clock is the GPU's: a synchronised call's wall is its device time
        monkeypatch.setattr("harness.execute.timing.time",
                            type("Clock", (), {"perf_counter": staticmethod(
                                lambda: gpu.now / 1e3)}))

    def call(self, ms: float):
        calls = []

        def fn():
            calls.append(1)
            self.now += ms

        return fn, calls


@pytest.mark.parametrize("call_ms,warmup_ms,reps", [
    (41.0, 12.5, 2),   # one call fills the warm-up share three times over
    (5.0, 12.5, 3),
    (0.2, 12.5, 5),    # five fit in the budget
    (0.0, 12.5, 5),    # no wall: the full estimate
])
def test_estimate_calls_shrink_when_one_call_fills_the_warm_up(call_ms, warmup_ms, reps):
    from harness.execute.timing import est_reps

    assert est_reps(call_ms, warmup_ms) == reps


def test_a_long_call_costs_its_samples_and_few_calls_more(monkeypatch):
    """flash.yaml's naive attention at N=16384 takes 41 ms a call: the time pass's process
    made 1 + 5 calls around its 5 samples; with the caller's first call (timing.first_call)
    standing in for bench's, 2 estimating calls are left. A fast call keeps the full warm-up."""
    gpu = _FakeGPU(monkeypatch)
    kw = dict(device="cuda", warmup_ms=12.5, rep_ms=50, min_samples=5, max_samples=5,
              max_rel_err=0.5, flusher=lambda: None)
    fn, calls = gpu.call(41.0)
    s = bench(fn, called_ms=41.0, **kw)
    assert s.n == 5 and s.median == pytest.approx(41.0)
    assert len(calls) == 2 + 5
    fn, calls = gpu.call(41.0)
    bench(fn, **kw)  # no call made before: bench makes its own first call
    assert len(calls) == 1 + 2 + 5
    fn, calls = gpu.call(0.5)
    s = bench(fn, called_ms=0.5, **kw)
    assert s.median == pytest.approx(0.5)
    assert len(calls) == int(12.5 / 0.5) + s.n  # the warm-up, its first 5 estimating
