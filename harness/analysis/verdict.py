"""A one-line bottleneck verdict for a case: what limits it, from what ncu counted, and the next
lever, chosen for the kind of kernel the counters describe.

    latency-bound: SM 51%, memory 45%, DRAM 5%, all < 60%; traffic 0.97x the minimum (262 MB
    counted / 268 MB analytic); counted placement: 2,124 FLOP/B at 77% of the compute roof; MMA
    kernel (tensor pipe 51%); top stalls barrier 1.2, wait 1.0 cyc/inst -> next lever: overlap ...

Bound and class: analysis/bound.py. Each clause names the numbers a rule below read; for a case of
several kernels the class, stalls and occupancy are the dominant kernel's and say so. Without an
ncu breakdown the verdict is the analytic roofline placement ("... (analytic placement, no ncu)").

Levers, first match wins (X = excess traffic, T = tensor pipe %, DRAM roof = the counted DRAM
rate / the measured copy rate, else ncu's DRAM % of peak against 75 %, about 85 % of what a copy
reaches on H100/H200):
  1. X >= 1.3 and (memory-bound on DRAM or DRAM >= 30%) -> traffic: fuse / keep intermediates
     on chip (memory-bound on-chip, DRAM < 30%: extra DRAM bytes cost nothing; the rules below)
  2. memory-bound, X < 1.3 or not counted, DRAM roof >= 85% -> at the memory roof: done
  3. MMA kernel, compute-bound, T >= 70%           -> at the tensor-core roof: done
  4. MMA kernel, T < 70%, barrier / short_scoreboard / mio_throttle / wait among the top two
     stalls -> overlap softmax/epilogue with the MMAs (software pipelining), not occupancy
  5. MMA kernel, T < 70%, long_scoreboard / lg_throttle top -> feed the MMAs (more stages)
  6. no MMA, latency-bound, long_scoreboard top, theoretical occupancy <= 50% limited by
     registers or shared memory -> raise occupancy (the only place occupancy is a lever)
  7. no MMA, compute-bound (top stall not math_pipe_throttle) -> fewer instructions per element
  8. no MMA, long_scoreboard top, below the DRAM roof -> more bytes in flight
  9. no MMA, latency-bound, achieved < 60% of theoretical occupancy -> more/larger blocks
 10. otherwise the advice for the top stall (STALL_ADVICE)
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.analysis.bound import (Bound, Breakdown, counted_dram_bytes, decide,
                                    excess_traffic, num, on_chip)
from harness.analysis.roofline import Ceilings, Placement, place, place_counted

TRAFFIC_X = 1.3  # counted DRAM bytes over the op's minimum from which traffic is the lever
TRAFFIC_DRAM_PCT = 30.0  # ... when DRAM is busy enough for extra bytes to cost time
ROOF_FRACTION = 0.85  # of the measured copy rate: at the memory roof
ROOF_FRACTION_OF_PEAK = 0.75  # the same, from ncu's DRAM % of peak (a copy reaches ~88 %)
TENSOR_FED_PCT = 70.0  # tensor pipe this busy: as fed as attention/GEMM kernels get
LOW_OCCUPANCY_PCT = 50.0  # theoretical occupancy at or under which occupancy can be a lever
MMA_OVERLAP_STALLS = ("barrier", "short_scoreboard", "mio_throttle", "wait")

STALL_ADVICE = {
    "long_scoreboard": "more memory in flight (wider/vectorised loads, more stages or warps)",
    "lg_throttle": "fewer, wider global memory instructions (vectorise)",
    "mio_throttle": "fewer shared-memory / special-function instructions per FLOP",
    "short_scoreboard": "fewer shared-memory round trips or MUFU ops on the critical path",
    "barrier": "fewer block-wide barriers, or more warps to hide them",
    "math_pipe_throttle": "the math pipe is saturated: use tensor cores or cheaper math",
    "wait": "fewer dependent fixed-latency instructions (more ILP)",
    "not_selected": "enough eligible warps: the issue slot is busy (good)",
    "no_instruction": "instruction cache misses: smaller unrolled code",
    "dispatch_stall": "pipeline dispatch contention",
    "gmma": "waiting on wgmma: deeper software pipelining of the tensor-core work",
    "membar": "fewer memory fences",
    "branch_resolving": "fewer divergent branches",
    "tex_throttle": "fewer texture/L1TEX requests",
    "drain": "write-back at exit (store-heavy tail)",
    "sleeping": "warps sleeping (nanosleep / yield)",
    "imc_miss": "constant-cache misses",
    "misc": "miscellaneous",
}


@dataclass(frozen=True)
class Judgement:
    bound: str | None  # memory | compute | latency from ncu's breakdown; None without one
    text: str  # the one-line verdict
    lever: str | None
    excess: float | None  # counted DRAM bytes / the op's minimum
    placement: Placement | None  # counted when ncu counted FLOPs and bytes, else analytic


def _bytes(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB" if n >= 1e6 \
        else f"{n / 1e3:.0f} kB"


def _x(x: float) -> str:
    return f"{x:.1f}x" if x >= 10 else f"{x:.2f}x"


def _ai(ai: float) -> str:
    return f"{ai:,.0f}" if ai >= 10 else f"{ai:.1f}"


def _stalls(facts: dict) -> list[tuple[str, float]]:
    out = []
    for k in ("top_stall", "second_stall"):
        name, v = facts.get(k), num(facts, k + "_value")
        if isinstance(name, str) and v is not None:
            out.append((name, v))
    return out


def _occupancy(facts: dict) -> str | None:
    occ, theo = num(facts, "achieved_occupancy_pct"), num(facts, "theoretical_occupancy_pct")
    if occ is None:
        return None
    s = f"occupancy {occ:.0f}%" + (f" of {theo:.0f}%" if theo is not None else "")
    lim = facts.get("occupancy_limiter")
    if isinstance(lim, str) and theo is not None and theo < 99.5:  # at 100% nothing limits
        s += f" (limit: {lim})"
    return s


def _placement_text(p: Placement, with_bound: bool) -> str:
    roof = "DRAM roof" if p.bound == "memory" else "compute roof"
    same = (f" ({p.size_copy_pct * 100:.0f}% of a copy of the same bytes)"
            if p.size_copy_pct is not None else "")
    if with_bound:  # no ncu breakdown: the placement is all there is to say what bounds it
        return f"{p.bound}-bound at {p.pct_of_roof * 100:.0f}% of the {roof}{same}"
    return (f"{p.basis} placement: {_ai(p.intensity or 0.0)} FLOP/B at "
            f"{p.pct_of_roof * 100:.0f}% of the {roof}{same}")


def _at_memory_roof(p: Placement) -> bool:
    """At the DRAM roof, or as close to it as a copy of the same bytes gets."""
    return p.pct_of_roof >= ROOF_FRACTION or (
        p.size_copy_pct is not None and p.size_copy_pct >= ROOF_FRACTION)


def dram_roof(facts: dict, ceil: Ceilings | None,
              b: Breakdown) -> tuple[float, str, bool] | None:
    """How close DRAM is to its roof: (fraction, what of, at the roof) from the counted DRAM
    rate / the measured copy rate, else from ncu's DRAM % of peak."""
    gbps = num(facts, "ncu_dram_gbps")
    if gbps is not None and ceil is not None and ceil.copy_gbps:
        f = gbps / ceil.copy_gbps
        same = ceil.copy_gbps_at(counted_dram_bytes(facts))
        if same and gbps / same > f and f < ROOF_FRACTION:  # short of the roof as a copy is
            g = gbps / same
            return g, f"of a copy of the same bytes ({f * 100:.0f}% of the 1 GiB copy rate)", \
                g >= ROOF_FRACTION
        return f, "of the measured copy rate", f >= ROOF_FRACTION
    if b.dram is None:
        return None
    return b.dram / 100, "of peak DRAM", b.dram / 100 >= ROOF_FRACTION_OF_PEAK


def next_lever(bound: Bound, b: Breakdown, facts: dict, excess: float | None,
               roof: tuple[float, str, bool] | None) -> tuple[str | None, bool]:
    """(lever, whether the occupancy numbers decided it) for a case with an ncu breakdown."""
    kind, mma = bound.kind, bound.mma
    tensor = b.kernel_tensor if b.kernel_tensor is not None else b.tensor  # the class's kernel
    stalls = [s for s, _ in _stalls(facts)]
    top = stalls[0] if stalls else None
    below_roof = roof is None or not roof[2]
    if excess is not None and excess >= TRAFFIC_X and (
            (kind == "memory" and not on_chip(b))
            or (b.dram is not None and b.dram >= TRAFFIC_DRAM_PCT)):
        return (f"traffic: {_x(excess)} the minimum bytes moved - fuse / keep intermediates "
                "on chip"), False
    if kind == "memory" and (excess is None or excess < TRAFFIC_X) and not below_roof:
        moved = f"{_x(excess)} the minimum bytes" if excess is not None else "bytes not counted"
        return (f"at the memory roof: done ({roof[0] * 100:.0f}% {roof[1]}, {moved}); only "
                "fewer bytes help (narrower dtype, fuse with neighbours)"), False
    if mma and tensor is not None:
        if kind == "compute" and tensor >= TENSOR_FED_PCT:
            return ("at the tensor-core roof: done; only fewer FLOPs help (skip masked blocks, "
                    "lower precision)"), False
        if tensor < TENSOR_FED_PCT and any(s in MMA_OVERLAP_STALLS for s in stalls):
            return ("overlap softmax/epilogue with the MMAs (software pipelining: num_stages, "
                    "warp specialization), not occupancy"), False
        if tensor < TENSOR_FED_PCT and top in ("long_scoreboard", "lg_throttle"):
            return "feed the MMAs: more loads in flight (num_stages, TMA / async copies)", False
    if mma is False:
        occ, theo = num(facts, "achieved_occupancy_pct"), num(facts, "theoretical_occupancy_pct")
        lim = facts.get("occupancy_limiter")
        if kind == "latency" and top == "long_scoreboard" and theo is not None \
                and theo <= LOW_OCCUPANCY_PCT and lim in ("registers", "shared_mem"):
            what = "registers per thread" if lim == "registers" else "shared memory per block"
            return f"raise occupancy: cut {what} (smaller tiles, fewer stages)", True
        if kind == "compute" and top != "math_pipe_throttle":
            return ("the SM is the limiter: fewer instructions per element (wider vector "
                    "loads/stores, cheaper math, less index arithmetic)"), False
        if top == "long_scoreboard" and below_roof:
            return "more bytes in flight (wider vector loads, more rows per program, more warps)", \
                False
        if kind == "latency" and occ is not None and theo and occ < 0.6 * theo:
            return "achieved occupancy well under theoretical: more/larger blocks, fix tail " \
                   "waves", True
    return STALL_ADVICE.get(top) if top else None, False


def judge(facts: dict, placement: Placement | None, excess: float | None = None,
          ceil: Ceilings | None = None) -> Judgement:
    """The verdict for one summary row (ncu facts of summary.ncu_case_view)."""
    b = Breakdown.from_facts(facts)
    bound = decide(b) if b is not None else None
    if bound is None:
        return _analytic_only(facts, placement, excess)
    lever, occupancy = next_lever(bound, b, facts, excess, dram_roof(facts, ceil, b))
    parts = [bound.text]
    counted = counted_dram_bytes(facts)
    if excess is not None and counted is not None:
        parts.append(f"traffic {_x(excess)} the minimum ({_bytes(counted)} counted / "
                     f"{_bytes(counted / excess)} analytic)")
    if placement is not None:
        parts.append(_placement_text(placement, with_bound=False))
    kernel = [bound.class_text]
    st = _stalls(facts)
    if st:
        kernel.append("top stalls " + ", ".join(f"{s} {v:.1f}" for s, v in st) + " cyc/inst")
    if occupancy:
        kernel.append(_occupancy(facts))
    kernel = [k for k in kernel if k]
    share = num(facts, "dominant_share")
    if b.kernels > 1 and kernel and isinstance(facts.get("dominant_kernel"), str):
        of = f" ({share * 100:.0f}% of the time)" if share is not None else ""
        kernel = [f"dominant kernel {facts['dominant_kernel']}{of}: " + ", ".join(kernel)]
    text = "; ".join(p for p in parts + kernel if p)
    return Judgement(bound.kind, f"{text} -> next lever: {lever}" if lever else text, lever,
                     excess, placement)


def _analytic_only(facts: dict, p: Placement | None, excess: float | None) -> Judgement:
    """No ncu speed-of-light breakdown: the analytic roofline placement, plus the stall and
    occupancy facts when ncu gave those."""
    has_ncu = num(facts, "ncu_duration_us") is not None
    parts = []
    if p is not None:
        why = "no ncu breakdown" if has_ncu else "no ncu"
        parts.append(f"{_placement_text(p, with_bound=True)} ({p.basis} placement, {why})")
    st = _stalls(facts)
    if st:
        parts.append(f"top stall {st[0][0]} ({st[0][1]:.1f} cyc/inst)")
    occ = _occupancy(facts)
    if occ:
        parts.append(occ)
    lever = None
    if p is not None and p.bound == "memory" and _at_memory_roof(p):
        lever = ("at the memory roof: done; only fewer bytes help (narrower dtype, fuse with "
                 "neighbours)")
    elif p is not None and p.pct_of_roof >= ROOF_FRACTION:
        lever = "at the compute roof: done; only fewer FLOPs help (skip masked work)"
    elif st:
        lever = STALL_ADVICE.get(st[0][0])
    text = "; ".join(parts) if parts else "no roofline or profiler data"
    return Judgement(None, f"{text} -> next lever: {lever}" if lever else text, lever, excess, p)


def assess(row: dict, flops: float | None, min_bytes: float | None, ceil: Ceilings | None,
           cuda: bool) -> tuple[Judgement, Placement | None]:
    """(the verdict, the analytic placement) of one summary row.

    flops / min_bytes: the op's analytic counts for the case. The verdict places the case from
    ncu's counted FLOPs and DRAM bytes (timed by ncu) when there are any, else analytically from
    the CUDA-event median (on a CUDA device with a calibration only)."""
    med = num(row, "median_ms")
    analytic = None
    if ceil is not None and med and cuda and flops is not None and min_bytes is not None:
        analytic = place(flops, min_bytes, med, row["dtype"], ceil)
    counted = None
    dram, fc, dur = counted_dram_bytes(row), num(row, "flop_count"), num(row, "ncu_duration_us")
    if ceil is not None and dram and fc is not None and dur:
        counted = place_counted(fc, dram, dur, row["dtype"], ceil)
    return judge(row, counted or analytic, excess_traffic(row, min_bytes), ceil), analytic
