"""What the L2 flush before each timed sample does to the timing (device, repo root):

    python3 tools/device/l2_flush_check.py

1. Memory-bound kernels (GroupNorm+Mish at three SD U-Net shapes and four launch configs, copies
   of 16 and 84 MB, the layernorm backward at 16384 x 1024) timed after three flushes of a 256
   MiB buffer — zeroing it (triton.testing.do_bench's way, and this harness's until
   TIMING_METHOD "l2-read-flush"), reading it (harness.execute.timing.Flusher), zeroing then
   reading — each with an idle gap of 0, 50 and 300 us between the flush and the start event.
2. Whether the reading flush evicts: a read-only sum of 16 MiB right after summing it (in L2),
   after the reading flush, after zeroing 256 MiB (a 50 us gap hides the host's launch time).

Medians of 200-300 CUDA-event samples in microseconds, one process. Run as this file on an
H200 (2026-11-24, at b8464aa; groupnorm configs are one-kernel two-pass ones, the split form at
N=1): the zeroing flush cost the groupnorm configs 0.7-7.0 us (2-16 %) over the reading flush
at every gap (e.g. (4096, 4, 4, 0) at N=16: 34.9-35.4 vs 31.2-31.3 us), the copies 0.7-3.3 us
(16 MB: 8.6-8.9 vs 7.5-7.9; 84 MB: 25.8-26.2 vs 22.9-23.6); zeroing then reading timed like
reading alone (within 0.9 us); the layernorm backward took 32.5-33.1 us after every reading
flush and 37.8 us after zeroing with a 300 us gap (133 and 96 us with gaps of 0 and 50 us: not
understood). The 16 MiB sum: 11.78 us from L2, 13.31 us after the reading flush, 14.66 us after
zeroing 256 MiB, so the reading flush does evict. The two diagnostic scripts this file
combines had measured the same on 2026-11-23 (zeroing: 3-6 us, 8-13 %; the sum 11.8 / 13.4 /
15.1 us).
"""
import statistics

import torch

from harness.execute.timing import FLUSH_BYTES, Flusher, _sleep_cycles_per_ms
from kernels.groupnorm_mish import triton_groupnorm_mish as gn
from kernels.layernorm import triton_layernorm_bwd as lnb

CYCLES_PER_US = _sleep_cycles_per_ms() / 1000


def median_us(fn, before, gap_us=0.0, n=200):
    """Median of `n` CUDA-event timings of fn(), each after before() and a gap_us GPU sleep."""
    for _ in range(20):
        before()
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
    for a, b in events:
        before()
        if gap_us:
            torch.cuda._sleep(int(gap_us * CYCLES_PER_US))
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in events) * 1e3


def kernels():
    out = {}
    for n, c, h in ((16, 320, 64), (4, 320, 128), (1, 320, 128)):
        x = (1.5 * torch.randn(n, c, h, h, device="cuda") + 0.2).half()
        w, b = torch.ones(c, device="cuda", dtype=torch.half), torch.zeros(c, device="cuda",
                                                                         dtype=torch.half)
        y = torch.empty_like(x)
        cfgs = [(4096, 8, 3, 0), (4096, 4, 4, 0), (8192, 16, 3, 0)]
        for cfg in cfgs + ([(8192, 8, 2, 10)] if n == 1 else []):
            out[f"groupnorm_mish N={n} {cfg}"] = (
                lambda x=x, w=w, b=b, y=y, cfg=cfg: gn.groupnorm_mish(x, 32, w, b, out=y,
                                                                      config=cfg))
    for mb in (16, 84):
        src = torch.randn(mb * 2**18, device="cuda", dtype=torch.half)  # mb/2 MB each way
        dst = torch.empty_like(src)
        out[f"copy {mb} MB"] = lambda s=src, d=dst: d.copy_(s)
    x = torch.randn(16384, 1024, device="cuda", dtype=torch.half)
    dy, w = torch.randn_like(x), torch.ones(1024, device="cuda", dtype=torch.half)
    mean, rstd = x.float().mean(1), 1 / x.float().std(1)
    out["layernorm_bwd 16384x1024"] = lambda: lnb.layernorm_bwd(dy, x, w, mean, rstd,
                                                                config=(4, 1, 1, 5))
    return out


def main():
    reader = Flusher("cuda", True)
    zeros = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    flushes = {"zero": zeros.zero_, "read": reader,
               "zero+read": lambda: (zeros.zero_(), reader())}
    gaps = (0, 50, 300)
    print(f"{'us':32s}" + "".join(f"{f}/{g}".rjust(13) for f in flushes for g in gaps))
    for name, fn in kernels().items():
        fn()
        torch.cuda.synchronize()
        print(f"{name:32s}" + "".join(f"{median_us(fn, fl, g):13.1f}"
                                       for fl in flushes.values() for g in gaps), flush=True)
    a = torch.randn(8 * 2**20, device="cuda", dtype=torch.half)  # 16 MiB
    s = torch.empty((), device="cuda", dtype=torch.float32)

    def total():
        torch.sum(a, dim=0, out=s)
    print(f"sum of 16 MiB: after summing it (in L2) {median_us(total, total, 50, 300):.2f} us; "
          f"after the reading flush {median_us(total, reader, 50, 300):.2f} us; after zeroing "
          f"256 MiB {median_us(total, zeros.zero_, 50, 300):.2f} us")


if __name__ == "__main__":
    main()
