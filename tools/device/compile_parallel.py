"""Does compiling a Tuner's candidate configs in parallel cut cold-cache compile time? (device)
The measurement behind kernels/_tuner.py's `precompile` (threads: 4.8 s -> 2.4 s for 6 flash
configs on an H200); kept to re-check it on a new Triton or GPU.

    python3 tools/device/compile_parallel.py            # runs each mode in a fresh process with a
                                                      # cold TRITON_CACHE_DIR and prints seconds
Modes: serial (warmup one config after another, as the Tuner did before `precompile`),
threads (a ThreadPoolExecutor of warmups, what the Tuner does now), async (triton's
AsyncCompileMode, if present).
"""
import os
import subprocess
import sys
import tempfile
import time


def one(mode: str) -> None:
    import math
    from concurrent.futures import ThreadPoolExecutor

    import torch
    import triton

    from kernels.attention.flash_fwd import FWD_CONFIGS, LOG2E, _flash_fwd_kernel

    B, H, N, D = 4, 16, 4096, 128
    q = torch.randn(B, H, N, D, device="cuda", dtype=torch.float16)
    k, v, o = torch.randn_like(q), torch.randn_like(q), torch.empty_like(q)
    lse = torch.empty((B, H, N), device="cuda", dtype=torch.float32)
    cfgs = FWD_CONFIGS[D]

    def warm(cfg):
        bm, bn, w, s = cfg
        return _flash_fwd_kernel.warmup(q, k, v, o, lse, N, LOG2E / math.sqrt(D), HEAD_DIM=D,
                                        BLOCK_M=bm, BLOCK_N=bn, CAUSAL=False, INTERP_BF16=False,
                                        num_warps=w, num_stages=s, grid=(1,))

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if mode == "serial":
        for c in cfgs:
            warm(c)
    elif mode == "threads":
        warm(cfgs[0])  # device caches initialised on this thread first
        with ThreadPoolExecutor(len(cfgs)) as ex:
            list(ex.map(warm, cfgs[1:]))
    elif mode == "async":
        from triton.runtime._async_compile import AsyncCompileMode

        with ThreadPoolExecutor(len(cfgs)) as ex, AsyncCompileMode(ex):
            for c in cfgs:
                warm(c)
    print(f"{mode}: {len(cfgs)} configs compiled in {time.perf_counter() - t0:.2f} s "
          f"(triton {triton.__version__})", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        one(sys.argv[1])
    else:
        for mode in ("serial", "threads", "async", "serial"):
            env = {**os.environ, "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="tcache-")}
            subprocess.run([sys.executable, __file__, mode], env=env)
