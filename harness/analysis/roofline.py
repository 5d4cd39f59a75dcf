"""Roofline placement against the device's measured ceilings (`harness calibrate`).

    ridge      = peak_tflops / peak_TB/s                     (FLOP per byte)
    roof(AI)   = min(peak_tflops, AI * peak_TB/s)
    pct_of_roof = achieved / roof(AI)
    bound      = memory if AI < ridge else compute

Two bases: "analytic" (the op's flops()/bytes() over the CUDA-event median) and "counted"
(ncu's counted FLOPs over its DRAM bytes, timed by ncu's duration): what the kernel really moved.

The DRAM roof is a 1 GiB copy's rate. A kernel that moves tens of MB cannot reach it: a launch's
ramp-up and tail cost a few microseconds that a 15 us kernel cannot hide, and a copy of the same
bytes is just as short of it. So where the calibration has its copy curve (copies of 8 MiB to
1 GiB, timed like the cases: L2 flushed, CUDA events), a memory-bound placement also says how
close it is to a copy of its own byte count (`size_copy_pct`), interpolated in log(bytes).

The compute roof for a case is the tensor-core matmul rate of its dtype (fp16/bf16) and the
measured fp32 FMA rate for float32 cases.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Ceilings:
    copy_gbps: float
    matmul_tflops: dict  # dtype -> TFLOP/s
    fma_tflops_fp32: float
    gpu_name: str = ""
    copy_curve: tuple = ()  # ((bytes read + written, GB/s), ...) ascending; () when not measured

    @classmethod
    def from_calibration(cls, cal: dict | None) -> "Ceilings | None":
        if not cal or not cal.get("copy_gbps"):
            return None
        curve = tuple(sorted((float(b), float(g)) for b, g in cal.get("copy_curve") or ()
                             if b and g and b > 0 and g > 0))
        return cls(float(cal["copy_gbps"]), dict(cal.get("matmul_tflops", {})),
                   float(cal.get("fma_tflops_fp32") or math.nan), cal.get("gpu_name", ""),
                   curve)

    def copy_gbps_at(self, nbytes: float | None) -> float | None:
        """A copy's GB/s at `nbytes` (read + written), interpolated in log(bytes) between the
        measured sizes; the largest one's beyond them; None below the smallest (not measured:
        a launch-bound size) or without a curve."""
        pts = self.copy_curve
        if not pts or not nbytes or nbytes < pts[0][0]:
            return None
        if nbytes >= pts[-1][0]:
            return pts[-1][1]
        for (b0, g0), (b1, g1) in zip(pts, pts[1:]):
            if b0 <= nbytes <= b1:
                f = math.log(nbytes / b0) / math.log(b1 / b0) if b1 > b0 else 0.0
                return g0 + f * (g1 - g0)
        return None

    def compute_roof(self, dtype: str) -> float:
        if dtype in self.matmul_tflops:
            return float(self.matmul_tflops[dtype])
        return self.fma_tflops_fp32

    def ridge(self, dtype: str) -> float:
        return self.compute_roof(dtype) / (self.copy_gbps / 1e3)


@dataclass(frozen=True)
class Placement:
    intensity: float | None  # FLOP/byte
    bound: str  # memory | compute: the side of the ridge the intensity falls on
    pct_of_roof: float  # 0..1+
    roof_tflops: float | None
    achieved_tflops: float | None
    achieved_gbps: float | None
    basis: str = "analytic"  # analytic | counted
    size_copy_pct: float | None = None  # 0..1+ of a copy of the same bytes (memory-bound only)


def place(flops: float, nbytes: float, median_ms: float, dtype: str, ceil: Ceilings,
          basis: str = "analytic") -> Placement:
    secs = median_ms * 1e-3
    gbps = nbytes / secs / 1e9 if nbytes else None
    tflops = flops / secs / 1e12 if flops else None
    same = ceil.copy_gbps_at(nbytes)
    size_pct = gbps / same if gbps and same else None
    if not flops:
        return Placement(0.0, "memory", (gbps or 0) / ceil.copy_gbps, None, None, gbps, basis,
                         size_pct)
    ai = flops / nbytes if nbytes else math.inf
    peak = ceil.compute_roof(dtype)
    roof = min(peak, ai * ceil.copy_gbps / 1e3)
    bound = "memory" if ai < ceil.ridge(dtype) else "compute"
    return Placement(ai, bound, tflops / roof if roof else math.nan, roof, tflops, gbps, basis,
                     size_pct if bound == "memory" else None)


def place_counted(flop_count: float, dram_bytes: float, duration_us: float, dtype: str,
                  ceil: Ceilings) -> Placement:
    """Placement from what ncu counted: FLOPs, DRAM bytes read + written, kernel duration."""
    return place(flop_count, dram_bytes, duration_us * 1e-3, dtype, ceil, basis="counted")
