"""What torch_compile costs per new shape in a process whose caches are warm (device).

    python3 tools/device/compile_shapes.py [fwd|bwd] [cprofile]

Walks flash_bwd.yaml's shapes (B*N = 16k tokens, H=16, D 64/128, causal and not, fp16 and
bf16) through attention's torch_compile impl as the worker binds it, and prints per shape the
seconds of the binder (the forward, in bwd mode), the first measured call and the second.
Run it twice: the first process fills Triton's and Inductor's caches, the second is what a
check, time or profiler worker meets after compile-ahead. With `cprofile`, the second and
later shapes' first calls are profiled and the top entries printed. Unlike a worker, this
process does not reuse the host's choices of Inductor's configs
(harness.tuning.inductor_picks): each graph's first call here times them again.
"""
import cProfile
import pstats
import sys
import time

import torch

import kernels  # noqa: F401  (registers every op)
from harness.registry import Params, get_op


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "bwd"
    prof = cProfile.Profile() if "cprofile" in sys.argv else None
    op = get_op("attention")
    impl = op.get_impl("torch_compile")
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for D in (64, 128):
            for causal in (False, True):
                for N in (1024, 2048, 4096, 8192, 16384):
                    p = Params({"B": 16384 // N, "H": 16, "N": N, "D": D, "causal": causal,
                                "mode": mode})
                    gen = torch.Generator(device="cuda").manual_seed(0)
                    inputs = op.make_inputs(p, dtype, "cuda", gen)
                    torch.cuda.synchronize()
                    if prof is not None and rows:
                        prof.enable()
                    t0 = time.perf_counter()
                    fn = op.bind_impl(impl, inputs, p, None)
                    torch.cuda.synchronize()
                    t1 = time.perf_counter()
                    fn()
                    torch.cuda.synchronize()
                    t2 = time.perf_counter()
                    if prof is not None:
                        prof.disable()
                    fn()
                    torch.cuda.synchronize()
                    t3 = time.perf_counter()
                    rows.append((f"{str(dtype)[6:]} D={D} causal={causal} N={N}",
                                 t1 - t0, t2 - t1, t3 - t2))
                    del fn, inputs
    tot = [0.0, 0.0, 0.0]
    for name, *ts in rows:
        print(f"{name:34s} bind {ts[0]:7.3f}  first {ts[1]:7.3f}  second {ts[2]:7.3f}")
        tot = [a + b for a, b in zip(tot, ts)]
    print(f"{'total':34s} bind {tot[0]:7.3f}  first {tot[1]:7.3f}  second {tot[2]:7.3f}")
    if prof is not None:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(45)


if __name__ == "__main__":
    main()
