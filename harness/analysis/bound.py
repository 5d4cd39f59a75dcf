"""What limits a case, read from ncu's own speed-of-light breakdown, and how many more DRAM bytes
than the op needs it moved.

    compute = max(SM %, tensor pipe %)          memory = max(memory %, DRAM %)     (% of peak)
    bound   = the larger of the two, when it is >= 60 % of peak (compute wins a tie); memory
              with DRAM < 30 % is "memory-bound (on-chip)": L1/shared or L2 is the busy unit
            = latency, when both are under 60 %: no unit is busy, the warps wait
    class   = MMA kernel when the tensor pipe is active >= 10 % of the time, else reduction /
              elementwise (decided from the counters, never from the impl's name; for a case of
              several kernels, the class of the dominant kernel, whose stalls the verdict reads)
    excess traffic = (dram_bytes_read + dram_bytes_write, summed over the case's kernels)
                     / op.bytes(case), the fewest bytes the op must move

For a case of several kernels the percentages are the duration-weighted means over its kernels
(`case_*` columns of summary.ncu_case_view); for one kernel they are its own values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

BOUND_PCT = 60.0  # a unit this busy is the limiter (ncu's own rule of thumb for its SOL section)
MMA_TENSOR_PCT = 10.0  # tensor pipe active at least this share of the time: an MMA kernel
ON_CHIP_DRAM_PCT = 30.0  # memory-bound with DRAM under this: L1/shared or L2 is the busy unit


def num(facts: dict, key: str) -> float | None:
    """facts[key] as a finite float, else None."""
    v = facts.get(key)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) or math.isinf(v) else v


def _case_pct(facts: dict, name: str) -> float | None:
    v = num(facts, "case_" + name)
    return v if v is not None else num(facts, name)


@dataclass(frozen=True)
class Breakdown:
    """ncu's speed-of-light percentages (of peak) for one case."""
    sm: float | None
    memory: float | None
    dram: float | None
    tensor: float | None
    kernels: int = 1
    kernel_tensor: float | None = None  # the dominant kernel's tensor pipe % (its class)

    @classmethod
    def from_facts(cls, facts: dict) -> "Breakdown | None":
        """From a summary row; None when ncu gave neither SM nor memory throughput."""
        sm, mem = _case_pct(facts, "sm_throughput_pct"), _case_pct(facts, "memory_throughput_pct")
        if sm is None and mem is None:
            return None
        k = num(facts, "ncu_kernels")
        return cls(sm, mem, _case_pct(facts, "dram_throughput_pct"),
                   _case_pct(facts, "tensor_pipe_pct"), int(k) if k else 1,
                   num(facts, "tensor_pipe_pct"))


@dataclass(frozen=True)
class Bound:
    kind: str  # memory | compute | latency
    mma: bool | None  # None: no tensor pipe counter
    text: str  # "memory-bound: memory 80% >= 60% (DRAM 80%, SM 62%)"
    class_text: str | None  # "MMA kernel (tensor pipe 51%)"


def _pct(name: str, v: float | None) -> str | None:
    return None if v is None else f"{name} {v:.0f}%"


def decide(b: Breakdown) -> Bound:
    compute = max((v for v in (b.sm, b.tensor) if v is not None), default=0.0)
    memory = max((v for v in (b.memory, b.dram) if v is not None), default=0.0)
    top = max(compute, memory)
    weighted = f"{b.kernels} kernels, duration-weighted" if b.kernels > 1 else None
    if top >= BOUND_PCT:
        kind = "compute" if compute >= memory else "memory"
        if kind == "compute":
            lead = _pct("SM", b.sm) if b.sm == compute else _pct("tensor pipe", b.tensor)
            rest = [_pct("memory", b.memory), _pct("DRAM", b.dram)]
        else:
            lead = _pct("memory", b.memory) if b.memory == memory else _pct("DRAM", b.dram)
            rest = [_pct("DRAM", b.dram) if b.memory == memory else _pct("memory", b.memory),
                    _pct("SM", b.sm)]

        inner = ", ".join(x for x in rest if x)
        inner = "; ".join(x for x in (inner, weighted) if x)
        where = " (on-chip)" if kind == "memory" and on_chip(b) else ""
        text = f"{kind}-bound{where}: {lead} >= {BOUND_PCT:.0f}%" + (f" ({inner})" if inner
                                                                        else "")
    else:
        kind = "latency"
        units = [_pct("SM", b.sm), _pct("memory", b.memory), _pct("DRAM", b.dram)]
        text = (f"latency-bound: {', '.join(u for u in units if u)}, all < {BOUND_PCT:.0f}%"
                + (f" ({weighted})" if weighted else ""))
    t = b.kernel_tensor if b.kernel_tensor is not None else b.tensor
    if t is None:
        return Bound(kind, None, text, None)
    mma = t >= MMA_TENSOR_PCT
    return Bound(kind, mma, text, f"{'MMA kernel' if mma else 'no MMA'} (tensor pipe {t:.0f}%)")


def on_chip(b: Breakdown) -> bool:
    """Memory-busy but not on DRAM: ncu's memory % (the busiest of L1/shared, L2 and DRAM) is
    >= BOUND_PCT while DRAM itself is under ON_CHIP_DRAM_PCT (sdpa_cudnn's backward on an H200:
    memory 67%, DRAM 9%): the bytes that cost time never leave the chip."""
    return (b.memory is not None and b.memory >= BOUND_PCT and b.dram is not None
            and b.dram < ON_CHIP_DRAM_PCT)


def counted_dram_bytes(facts: dict) -> float | None:
    """DRAM bytes read + written that ncu counted over the case's kernels (None: not counted)."""
    rd, wr = num(facts, "dram_bytes_read"), num(facts, "dram_bytes_write")
    return None if rd is None or wr is None else rd + wr


def excess_traffic(facts: dict, min_bytes: float | None) -> float | None:
    """Counted DRAM bytes / the op's analytic minimum; None when either is unknown."""
    counted = counted_dram_bytes(facts)
    if counted is None or not min_bytes or min_bytes <= 0:
        return None
    return counted / min_bytes
