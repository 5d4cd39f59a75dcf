"""What the L2 flush before each timed sample does to the timing (device, repo root):

    python3 benchmarks/l2_flush_check.py

1. Memory-bound kernels (GroupNorm+Mish at three SD U-Net shapes and four launch configs, copies
   of 16 and 84 MB, the layernorm backward at 16384 x 1024) timed after three flushes of a
   256 MiB buffer — zeroing it (triton.testing.do_bench's way, and this harness's until
   TIMING_METHOD "l2-read-flush"), reading it (harness.timing.Flusher), zeroing then reading —
   each with an idle gap of 0, 50 and 300 us between the flush and the start event.
2. Whether the reading flush evicts: a read-only sum of 16 MiB right after summing it (in L2),
   after the reading flush, after zeroing 256 MiB (a 50 us gap hides the host's launch time).

Medians of 200-300 CUDA-event samples in microseconds, one process. The figures below were
taken on an H200 (2026-11-23) by the two diagnostic scripts this file combines (the same
kernels, flushes and loops); this file itself has not been run on a GPU yet:
the zeroing flush cost memory-bound kernels 3-6 us (8-13 %) at every gap, and zeroing then
reading was as fast as reading (the timed kernel was writing back the flush's dirty lines);
the 16 MiB sum took 11.8 us from L2, 13.4 us after the reading flush, 15.1 us after zeroing.
"""
import statistics

import torch

from harness.timing import FLUSH_BYTES, Flusher, _sleep_cycles_per_ms
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
