"""Two callables timed interleaved, for `harness ab`: the paired rounds of analysis.paired.

A round is a burst of `k` launches of one version and then a burst of the other, every launch
as harness.execute.timing times one (the L2 flushed before it by the same Flusher, the host's launch
time hidden by the same torch.cuda._sleep, a CUDA event pair around it), the order alternating
from round to round (AB, BA, AB, ...: each version takes each slot equally often). A burst's
statistic is the median of its launches. Bursts are ~BURST_MS of GPU time (at most MAX_BURST
launches); the host synchronises once per block of rounds (~BLOCK_MS), reading the SM clock
while the block runs (as timing._bench_cuda does per batch). Both versions run on the same
inputs in the same process, so what drifts (clocks, temperature, other tenants) drifts for both.

Budget: warm-up `warmup_ms` in all, then rounds until both versions together have spent
2 x `rep_ms` (what timing each once would), and at least MIN_ROUNDS rounds and `min_samples`
launches each; earlier once the paired standard error of the per-round log ratio is below
`max_rel_err` / 10 (the ratio is then known far more precisely than either time); never more
than `max_samples` launches of a version.

On the CPU (the interpreter) the same rounds with time.perf_counter and bursts of one call.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from harness.execute.timing import (HOST_REPS, Flusher, Samples, capture_graph,
                                    flushed_call_ms, hiding_cycles, spin_cycles)

BURST_MS = 1.0
MAX_BURST = 8
BLOCK_MS = 20.0
MIN_ROUNDS = 10
MIN_ROUNDS_CPU = 5
SE_FRACTION = 0.1  # stop early at a paired standard error of max_rel_err x this


@dataclass(frozen=True)
class Rounds:
    samples: tuple[Samples, Samples]  # every launch of version 0 and of version 1
    first: tuple[int, ...]  # per round: the version whose burst went first
    burst_ms: tuple[tuple[float, float], ...]  # per round: (version 0, version 1) burst median
    clocks: tuple[float | None, ...]  # per round: the SM clock (MHz) read in its block
    burst: int  # launches per burst

    @property
    def n(self) -> int:
        return len(self.burst_ms)


def _enough(d: list[float], n_samples: int, elapsed_ms: float, budget_ms: float,
            min_rounds: int, min_samples: int, max_samples: int, target_se: float) -> bool:
    if n_samples >= max_samples:
        return True
    if len(d) < min_rounds or n_samples < min_samples:
        return False
    if elapsed_ms >= budget_ms:
        return True
    return float(np.std(d, ddof=1)) / math.sqrt(len(d)) <= target_se


def bench_pair(fns: Sequence[Callable[[], object]], *, device: str, warmup_ms: float = 25.0,
               rep_ms: float = 200.0, min_samples: int = 10, max_samples: int = 5000,
               max_rel_err: float = 0.005, flush_l2: bool = True, cuda_graph: bool = False,
               host_overhead: str = "hide", flusher: Flusher | None = None,
               clock_probe: Callable[[], float | None] | None = None) -> Rounds:
    """Time the two zero-argument callables `fns` interleaved (see the module docstring)."""
    if len(fns) != 2:
        raise ValueError("bench_pair times exactly two callables")
    target = max_rel_err * SE_FRACTION
    if device == "cuda":
        return _pair_cuda(list(fns), warmup_ms, rep_ms, min_samples, max_samples, target,
                          flusher or Flusher(device, flush_l2), cuda_graph,
                          host_overhead == "hide", clock_probe)
    return _pair_cpu(list(fns), warmup_ms, rep_ms, min_samples, max_samples, target)


def _rounds(per_launch: list[list[float]], clocks: list, first: list[int], k: int,
            clock: str, block_clocks: list[list[float]]) -> Rounds:
    bursts = []
    for r in range(len(first)):
        bursts.append(tuple(float(np.median(per_launch[v][r * k:(r + 1) * k])) for v in (0, 1)))
    samples = tuple(Samples(tuple(per_launch[v]), clock, tuple(c for c in block_clocks[v] if c))
                    for v in (0, 1))
    return Rounds(samples, tuple(first), tuple(bursts), tuple(clocks), k)


def _pair_cpu(fns, warmup_ms, rep_ms, min_samples, max_samples, target) -> Rounds:
    for fn in fns:
        fn()  # compilation / interpreter set-up
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < warmup_ms:
        for fn in fns:
            fn()
    per: list[list[float]] = [[], []]
    first: list[int] = []
    d: list[float] = []
    start = time.perf_counter()
    budget = 2 * min(rep_ms, 500.0)
    while not _enough(d, min(len(per[0]), len(per[1])), (time.perf_counter() - start) * 1e3,
                      budget, MIN_ROUNDS_CPU, min(min_samples, MIN_ROUNDS_CPU), max_samples,
                      target):
        order = (0, 1) if len(first) % 2 == 0 else (1, 0)
        for v in order:
            a = time.perf_counter()
            fns[v]()
            per[v].append((time.perf_counter() - a) * 1e3)
        first.append(order[0])
        d.append(math.log(per[1][-1] / per[0][-1]))
    return _rounds(per, [None] * len(first), first, 1, "cpu_wall", [[], []])


def _pair_cuda(fns, warmup_ms, rep_ms, min_samples, max_samples, target, flush, cuda_graph,
               hide_host, clock_probe) -> Rounds:
    import torch

    for fn in fns:
        fn()
    torch.cuda.synchronize()
    host: list[list[float]] = [[], []]
    est = [flushed_call_ms(fn, flush, HOST_REPS, h) for fn, h in zip(fns, host)]
    for _ in range(max(1, int(warmup_ms / sum(est)))):  # both warm, alternating
        for fn in fns:
            flush()
            fn()
    torch.cuda.synchronize()
    runs = [capture_graph(fn) for fn in fns] if cuda_graph else list(fns)
    clock = "cuda_graph" if cuda_graph else "cuda_events"
    sleep = 0  # the same for both
    if hide_host:
        sleep = max(hiding_cycles(run) if cuda_graph else spin_cycles(h)
                    for run, h in zip(runs, host))
    per_ms = max(est)
    k = int(min(MAX_BURST, max(1, round(BURST_MS / per_ms))))
    rounds_per_block = int(max(1, BLOCK_MS / (2 * k * per_ms)))
    per: list[list[float]] = [[], []]
    block_clocks: list[list[float]] = [[], []]
    first: list[int] = []
    clocks: list[float | None] = []
    d: list[float] = []
    begin = time.perf_counter()
    while not _enough(d, min(len(per[0]), len(per[1])), (time.perf_counter() - begin) * 1e3,
                      2 * rep_ms, MIN_ROUNDS, min_samples, max_samples, target):
        events = []  # (version, start, end) in launch order
        orders = []
        for _ in range(rounds_per_block):
            order = (0, 1) if (len(first) + len(orders)) % 2 == 0 else (1, 0)
            orders.append(order)
            for v in order:
                for _ in range(k):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                        enable_timing=True)
                    flush()
                    if sleep:
                        torch.cuda._sleep(sleep)
                    s.record()
                    runs[v]()
                    e.record()
                    events.append((v, s, e))
        mhz = clock_probe() if clock_probe is not None else None  # the block is running
        torch.cuda.synchronize()
        for v, s, e in events:
            per[v].append(s.elapsed_time(e))
        for order in orders:
            r = len(first)
            first.append(order[0])
            clocks.append(float(mhz) if mhz else None)
            b0 = float(np.median(per[0][r * k:(r + 1) * k]))
            b1 = float(np.median(per[1][r * k:(r + 1) * k]))
            d.append(math.log(b1 / b0) if b0 > 0 and b1 > 0 else 0.0)
        for v in (0, 1):
            block_clocks[v].append(float(mhz) if mhz else 0.0)
    return _rounds(per, clocks, first, k, clock, block_clocks)
