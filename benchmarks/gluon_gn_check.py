"""First light of groupnorm_mish's Gluon form (SYNC: 2: persistent, whole groups in shared
memory, double-buffered; kernels/groupnorm_mish/gluon_groupnorm_mish.py) on a Hopper GPU: each candidate's largest
error against the torch reference (fp32 math on the same inputs) next to the Triton pick's, and
its L2-flushed median time beside the Triton pick's and a copy of the same bytes. A probe before
the harness runs experiments/groupnorm_mish.yaml (whose figures are the ones that count).

    python3 benchmarks/gluon_gn_check.py          (device: sm_90)
"""
from __future__ import annotations

import statistics
import sys

import torch
import torch.nn.functional as F

from kernels.groupnorm_mish import gluon_groupnorm_mish as gg
from kernels.groupnorm_mish import triton_groupnorm_mish as tg

SHAPES = [(16, 320, 64, 64), (32, 640, 32, 32), (4, 320, 128, 128), (1, 320, 128, 128)]


def timed(fn, reps: int = 50) -> float:
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        flush.sum()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out) * 1e3


def main() -> int:
    bad = 0
    for dtype in (torch.float16, torch.bfloat16):
        for N, C, H, W in SHAPES:
            G = 32
            gen = torch.Generator(device="cuda").manual_seed(0)
            x = (1.5 * torch.randn(N, C, H, W, device="cuda", generator=gen) + 0.2).to(dtype)
            w = (1 + 0.1 * torch.randn(C, device="cuda", generator=gen)).to(dtype)
            b = (0.1 * torch.randn(C, device="cuda", generator=gen)).to(dtype)
            ref = F.mish(F.group_norm(x.float(), G, w.float(), b.float(), 1e-5))
            y_t = tg.groupnorm_mish(x, G, w, b)
            err_t = (y_t.float() - ref).abs().max().item()
            src = torch.empty_like(x)
            copy_us = timed(lambda: src.copy_(x))
            pick_us = timed(lambda: tg.groupnorm_mish(x, G, w, b, out=y_t))
            print(f"{str(dtype)[6:]:8s} N={N} C={C} {H}x{W}: copy {copy_us:5.1f} us  triton pick "
                  f"{pick_us:5.1f} us ({copy_us / pick_us:4.0%} of copy) err {err_t:.1e}",
                  flush=True)
            cpg, hw = C // G, H * W
            for cfg in gg.configs(cpg, hw):
                y = torch.full_like(x, float("nan"))
                tg.groupnorm_mish(x, G, w, b, out=y, config=cfg)
                torch.cuda.synchronize()
                err = (y.float() - ref).abs().max().item()
                ok = err <= 2 * err_t + 1e-3
                bad += not ok
                us = timed(lambda: tg.groupnorm_mish(x, G, w, b, out=y, config=cfg))
                print(f"    gluon {cfg}: {us:5.1f} us ({copy_us / us:4.0%} of copy) err {err:.1e}"
                      f" {'ok' if ok else 'WRONG'}", flush=True)
    print(f"{bad} wrong")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
