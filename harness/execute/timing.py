"""Timing of one zero-argument callable.

GPU (`clock="cuda_events"`): a CUDA event pair around every call; the L2 is flushed before each
sample (a 256 MiB buffer is read outside the events: see Flusher); warm-up runs by time first;
samples are taken in batches until the relative standard error of the mean is <= max_rel_err
(with at least min_samples) or the time budget rep_ms is spent. `cuda_graph: true` captures one
call into a CUDA graph and times its replays (launch overhead removed).

Host overhead: with `host_overhead="hide"` (default) the GPU is held in a short spin
(torch.cuda._sleep) after the flush, sized to twice the call's measured host (Python + launch)
time, so the kernels are already queued when the start event fires: the events then time the
device work alone, and a slow Python wrapper (torch.compile guards, autotuner lookups) cannot
leak into it. `host_overhead="include"` times what a caller waits for, idle gaps included.
Host launch cost is reported separately by the nsys pass (launch_api_us).

SM clock under load: `clock_probe` (the worker passes an NVML reading of its GPU) is read once
per batch, right after the batch is queued and before the host waits for it, so while the GPU
runs the samples: their median is `sm_clock_timed_mhz`. Unlocked clocks move between runs
(power and thermal management: on one H200 a triton_flash case read 1815 MHz after its timing
in one run and 1950 MHz in the next, 1.11x apart in time); compare names the clock and does not
credit the code with a change the clock alone explains.

Several processes (`timing.processes`; by default 2 on a GPU, 1 on the CPU: store.time_processes):
the time pass times each case in that many worker processes, one after the other, and pools
their samples; `share` gives each process its part of the budget (warm-up, rep_ms and sample
counts divided, the stopping error scaled so the pooled samples meet max_rel_err), so a case
costs about what one process spent on it before, and the spread of its per-process medians is
its own between-process noise (pyperf's lesson).

CPU (`clock="cpu_wall"`): the same loop with time.perf_counter — only meaningful relative to
other CPU numbers; the summary labels these timings.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

FLUSH_BYTES = 256 * 1024 * 1024  # > 5x the L2 of an H100/H200 (50 MiB)
from harness.machine.env import TIMING_METHOD  # noqa: F401 - part of timing's interface


@dataclass(frozen=True)
class Samples:
    ms: tuple[float, ...]
    clock: str  # cuda_events | cuda_graph | cpu_wall
    clocks_mhz: tuple[float, ...] = ()  # SM clock read while the samples ran (one per batch)

    @property
    def n(self) -> int:
        return len(self.ms)

    def _q(self, q: float) -> float:
        return float(np.quantile(np.asarray(self.ms), q)) if self.ms else math.nan

    @property
    def median(self) -> float:
        return self._q(0.5)

    @property
    def p20(self) -> float:
        return self._q(0.2)

    @property
    def p80(self) -> float:
        return self._q(0.8)

    @property
    def iqr(self) -> float:
        return self._q(0.75) - self._q(0.25)

    @property
    def rel_stderr(self) -> float:
        return rel_stderr(self.ms)

    def summary(self) -> dict:
        return {"median_ms": self.median, "p20_ms": self.p20, "p80_ms": self.p80,
                "iqr_ms": self.iqr, "n_samples": self.n, "rel_stderr": self.rel_stderr,
                "clock": self.clock,
                "sm_clock_timed_mhz": (float(np.median(self.clocks_mhz)) if self.clocks_mhz
                                       else None)}


MIN_SHARE_SAMPLES = 5  # samples a process takes at least (its median is a between-process point)
BATCH_MS = 20.0  # GPU work queued between two host syncs (one process's share of it: share)


def share(processes: int, *, warmup_ms: float, rep_ms: float, min_samples: int,
          max_samples: int, max_rel_err: float) -> dict:
    """One worker process's part of a case's timing budget when `processes` share it: the
    keyword arguments of `bench` (warm-up, rep_ms, min/max samples, max_rel_err, batch_ms).
    The batch is shared too: most cases meet max_rel_err after their first batch, so with
    whole batches each process took what one process took alone (on an H200, flash.yaml's
    time pass in two processes cost 1.8x one's), and the pooled samples now match it."""
    p = max(1, int(processes))
    return {"warmup_ms": warmup_ms / p, "rep_ms": rep_ms / p, "batch_ms": BATCH_MS / p,
            "min_samples": max(MIN_SHARE_SAMPLES, math.ceil(min_samples / p)),
            "max_samples": max(MIN_SHARE_SAMPLES, math.ceil(max_samples / p)),
            "max_rel_err": min(0.5, max_rel_err * math.sqrt(p))}


def rel_stderr(ms) -> float:
    a = np.asarray(ms, dtype=float)
    if a.size < 2 or a.mean() <= 0:
        return math.inf
    return float(a.std(ddof=1) / math.sqrt(a.size) / a.mean())


class Flusher:
    """`flusher()` evicts the L2 by reading a FLUSH_BYTES buffer (a sum into a device scalar;
    a no-op when disabled or without a GPU); one per process is enough (the worker's, the
    Tuners').

    Reading, not writing: zeroing the buffer (this harness until TIMING_METHOD
    "l2-read-flush", and triton.testing.do_bench's flush) leaves the L2 full of dirty lines,
    and the kernel timed next pays for writing them back to DRAM. Measured on an H200 (same
    kernels, same process, 200 samples each): after a zeroing flush, memory-bound kernels of
    16-84 MB took 3-6 us (8-13 %) longer than after a reading flush — a copy of 84 MB 25.9
    vs 23.2 us, GroupNorm+Mish at 84 MB 37.0 vs 32.9 us — whatever the idle gap between
    the flush and the kernel (0-300 us), and zeroing then reading was as fast as reading."""

    def __init__(self, device: str, enabled: bool):
        self.buf = None
        if enabled and device == "cuda":
            import torch

            self.buf = torch.ones(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
            self.sink = torch.empty((), dtype=torch.int64, device="cuda")

    def __call__(self) -> None:
        if self.buf is not None:
            import torch

            torch.sum(self.buf, dim=0, out=self.sink)


def bench(fn: Callable[[], object], *, device: str, warmup_ms: float = 25.0,
          rep_ms: float = 200.0, min_samples: int = 10, max_samples: int = 5000,
          flush_l2: bool = True, cuda_graph: bool = False, max_rel_err: float = 0.005,
          host_overhead: str = "hide", flusher: Flusher | None = None,
          clock_probe: Callable[[], float | None] | None = None,
          batch_ms: float = BATCH_MS, called_ms: float | None = None) -> Samples:
    """Time `fn`; return the raw samples in milliseconds. `called_ms` (GPU): the wall time of
    a synchronised call of `fn` the caller has just made (timing.first_call); bench then makes
    no first call of its own."""
    if device == "cuda":
        return _bench_cuda(fn, warmup_ms, rep_ms, min_samples, max_samples,
                           flusher or Flusher(device, flush_l2), cuda_graph, max_rel_err,
                           host_overhead == "hide", clock_probe, batch_ms, called_ms)
    return _bench_cpu(fn, warmup_ms, rep_ms, min_samples, max_samples, max_rel_err)


_SLEEP_CYCLES_PER_MS: float | None = None


def _sleep_cycles_per_ms() -> float:
    """How many torch.cuda._sleep cycles make a millisecond on this GPU (measured once)."""
    global _SLEEP_CYCLES_PER_MS
    if _SLEEP_CYCLES_PER_MS is None:
        import torch

        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(100_000)
        s.record()
        torch.cuda._sleep(2_000_000)
        e.record()
        torch.cuda.synchronize()
        _SLEEP_CYCLES_PER_MS = 2_000_000 / max(s.elapsed_time(e), 1e-3)
    return _SLEEP_CYCLES_PER_MS


HOST_REPS = 5  # calls whose host time (median) sizes the spin of host_overhead "hide"
MIN_HOST_REPS = 2  # ... where one call alone fills a large part of the warm-up (est_reps)


def host_ms(fn: Callable[[], object], reps: int = 5) -> float:
    """Median host time to enqueue one call (Python + launches), the device drained between."""
    import torch

    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return float(np.median(times))


def hiding_cycles(fn: Callable[[], object]) -> int:
    """torch.cuda._sleep cycles that hold the GPU for twice `fn`'s host time (20 us to 5 ms):
    queued after the L2 flush and before the start event, the call's kernels are all queued
    when the event fires, so the events time the device work alone (host_overhead "hide").
    Measures the host time with the device drained (host_ms); where the calls were just made
    by flushed_call_ms, spin_cycles of the host times it collected costs nothing more."""
    return spin_cycles([host_ms(fn)])


def spin_cycles(host: list[float]) -> int:
    """hiding_cycles for host times in ms (their median) measured elsewhere."""
    return int(min(max(2 * float(np.median(host)), 0.02), 5.0) * _sleep_cycles_per_ms())


def est_reps(call_ms: float, warmup_ms: float) -> int:
    """How many flushed calls estimate a call's time and its host time before the warm-up
    goes on (they are the warm-up's first calls): HOST_REPS where they fit in the warm-up
    budget, fewer, down to MIN_HOST_REPS, where one call (`call_ms`, the first one's wall)
    takes a large part of it. Five calls of flash.yaml's naive attention at N=16384 (41 ms
    each) were 205 ms of GPU time against a warm-up share of 12.5 ms, in each process; over
    the time pass such calls outside the samples (this estimate, the first call, the peak
    memory and provenance calls) cost more than the samples (H100, 2026-11-26, by the cases'
    medians: about 18 s of such calls against 14 s of samples in a 42 s pass). An overlong
    first call (loading on first use) only makes the estimate shorter: the warm-up that
    follows is sized by the estimate and fills the budget."""
    if call_ms <= 0:
        return HOST_REPS
    return int(min(HOST_REPS, max(MIN_HOST_REPS, math.ceil(warmup_ms / call_ms))))


def first_call(fn: Callable[[], object], inputs_bytes: int) -> tuple[int, float]:
    """One synchronised call of `fn`: its peak memory (peak_memory) and its wall time in ms,
    which bench's `called_ms` takes in place of a first call of its own."""
    t0 = time.perf_counter()
    peak = peak_memory(fn, inputs_bytes)
    return peak, (time.perf_counter() - t0) * 1e3


def _enough(ms: list[float], elapsed_ms: float, rep_ms: float, min_samples: int,
            max_samples: int, max_rel_err: float) -> bool:
    if len(ms) >= max_samples:
        return True
    if len(ms) < min_samples:
        return False
    return elapsed_ms >= rep_ms or rel_stderr(ms) <= max_rel_err


def _bench_cpu(fn, warmup_ms, rep_ms, min_samples, max_samples, max_rel_err) -> Samples:
    t0 = time.perf_counter()
    fn()  # at least one warm-up call: compilation / interpreter set-up
    while (time.perf_counter() - t0) * 1e3 < warmup_ms:
        fn()
    ms: list[float] = []
    start = time.perf_counter()
    while not _enough(ms, (time.perf_counter() - start) * 1e3, rep_ms, min_samples,
                      max_samples, max_rel_err):
        a = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - a) * 1e3)
    return Samples(tuple(ms), "cpu_wall")


def flushed_call_ms(fn: Callable[[], object], flush: Callable[[], object], calls: int,
                    host: list[float] | None = None) -> float:
    """Milliseconds per call of `fn` preceded by `flush`, over `calls` back-to-back calls
    (CUDA events; at least 1 us): a rough estimate to size the timing that follows.

    `host` (a list) receives each call's host time in ms: the calls are queued while the GPU
    works through the earlier ones, so nothing waits on the device and these are the host
    times host_ms measures with the device drained between calls (five synchronised calls
    more per case: in flash.yaml's time pass on an H200, 6 of a process's 38 s)."""
    import torch

    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(calls):
        flush()
        if host is None:
            fn()
            continue
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
    e.record()
    torch.cuda.synchronize()
    return max(s.elapsed_time(e) / calls, 1e-3)


def capture_graph(fn: Callable[[], object]) -> Callable[[], object]:
    """`fn` captured in a CUDA graph (after 3 calls on a side stream): its replay."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph.replay


def _bench_cuda(fn, warmup_ms, rep_ms, min_samples, max_samples, flush, cuda_graph,
                max_rel_err, hide_host, clock_probe=None, batch_ms=BATCH_MS,
                called_ms=None) -> Samples:
    import torch

    if called_ms is None:
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        called_ms = (time.perf_counter() - t0) * 1e3
    # estimate one call (with flush) to size the warm-up and the batches, and its host time;
    # these calls are the first of the warm-up
    host: list[float] = []
    reps = est_reps(called_ms, warmup_ms)
    est = flushed_call_ms(fn, flush, reps, host)
    for _ in range(int(warmup_ms / est) - reps):
        flush()
        fn()
    torch.cuda.synchronize()

    run = capture_graph(fn) if cuda_graph else fn
    clock = "cuda_graph" if cuda_graph else "cuda_events"

    sleep = 0
    if hide_host:  # hold the GPU until the call's kernels are queued (see module docstring)
        sleep = hiding_cycles(run) if cuda_graph else spin_cycles(host)
    batch = int(min(max(1, batch_ms / est), 100))  # ~batch_ms of work between host syncs
    ms: list[float] = []
    clocks: list[float] = []
    begin = time.perf_counter()
    while not _enough(ms, (time.perf_counter() - begin) * 1e3, rep_ms, min_samples,
                      max_samples, max_rel_err):
        n = min(batch, max_samples - len(ms))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            flush()
            if sleep:
                torch.cuda._sleep(sleep)
            starts[i].record()
            run()
            ends[i].record()
        if clock_probe is not None:  # the batch is queued and running: the clock under load
            mhz = clock_probe()
            if mhz:
                clocks.append(float(mhz))
        torch.cuda.synchronize()
        ms.extend(a.elapsed_time(b) for a, b in zip(starts, ends))
    return Samples(tuple(ms), clock, tuple(clocks))


def peak_memory(fn: Callable[[], object], inputs_bytes: int) -> int:
    """Peak bytes held during one call: the inputs plus everything the call allocates."""
    import torch

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out
    return int(peak - before + inputs_bytes)
