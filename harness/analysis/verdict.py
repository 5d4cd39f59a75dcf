"""A one-line bottleneck verdict from the roofline placement and the ncu facts of a case.

    "memory-bound at 91% of the DRAM roof; top stall long_scoreboard (3.1 cyc/inst);
     occupancy 46% of 50% (limit: registers) -> next lever: fewer bytes (fuse, narrower dtype)"
"""
from __future__ import annotations

import math

from harness.analysis.roofline import Placement

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


def _f(facts: dict, key: str):
    v = facts.get(key)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def verdict(p: Placement | None, facts: dict) -> str:
    parts: list[str] = []
    if p is not None:
        roof = "DRAM roof" if p.bound == "memory" else "compute roof"
        parts.append(f"{p.bound}-bound at {p.pct_of_roof * 100:.0f}% of the {roof}")
    top, top_v = facts.get("top_stall"), _f(facts, "top_stall_value")
    if top and top_v is not None:
        parts.append(f"top stall {top} ({top_v:.1f} cyc/inst)")
    occ, theo = _f(facts, "achieved_occupancy_pct"), _f(facts, "theoretical_occupancy_pct")
    lim = facts.get("occupancy_limiter")
    if occ is not None:
        s = f"occupancy {occ:.0f}%"
        if theo is not None:
            s += f" of {theo:.0f}%"
        if lim and theo is not None and theo < 99.5:  # at 100% nothing limits
            s += f" (limit: {lim})"
        parts.append(s)
    tp = _f(facts, "tensor_pipe_pct")
    if tp is not None and p is not None and p.bound == "compute":
        parts.append(f"tensor pipe {tp:.0f}%")
    lever = next_lever(p, facts)
    text = "; ".join(parts) if parts else "no roofline or profiler data"
    return f"{text} -> next lever: {lever}" if lever else text


def next_lever(p: Placement | None, facts: dict) -> str | None:
    occ, theo = _f(facts, "achieved_occupancy_pct"), _f(facts, "theoretical_occupancy_pct")
    top = facts.get("top_stall")
    lim = facts.get("occupancy_limiter")
    if p is not None and p.bound == "memory" and p.pct_of_roof >= 0.85:
        return "fewer bytes (fuse neighbours, narrower dtype): this kernel is at the DRAM roof"
    if p is not None and p.bound == "compute" and p.pct_of_roof >= 0.85:
        return "fewer FLOPs (skip masked work, cheaper algorithm): at the compute roof"
    if theo is not None and theo <= 25 and lim in ("registers", "shared_mem"):
        what = "registers per thread" if lim == "registers" else "shared memory per block"
        return f"raise occupancy: cut {what} (smaller tiles, fewer stages)"
    if occ is not None and theo is not None and theo > 0 and occ < 0.6 * theo:
        return "achieved occupancy well under theoretical: more/larger blocks, fix tail waves"
    tp = _f(facts, "tensor_pipe_pct")
    if p is not None and p.bound == "compute" and tp is not None and tp < 60:
        return "keep the tensor cores fed (larger tiles, deeper pipelining)"
    if top in STALL_ADVICE:
        return STALL_ADVICE[top]
    return None
