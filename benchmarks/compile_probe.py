"""Where a worker's first seconds go (device): imports, and torch.compile's first graph in a
fresh process, cold and warm on-disk caches, with and without Inductor's compile-worker pool.

    python3 benchmarks/compile_probe.py           # prints one line per fresh process
    python3 benchmarks/compile_probe.py profile   # where a warm-cache first call's seconds go
    python3 benchmarks/compile_probe.py triton    # flash fwd configs: cold vs warm Triton cache

Every profiler pass starts a new worker, so a one-time cost per process is paid three times
per run (check/time, ncu, nsys). This probe is what decides the worker's Inductor settings
(harness.executors.process.worker_env).
"""
import json
import os
import subprocess
import sys
import tempfile
import time


def child() -> None:
    t0 = time.perf_counter()
    import torch
    import triton  # noqa: F401

    import kernels  # noqa: F401  (registers every op, as the worker does)
    from kernels.attention.peers import torch_compile_attention

    t_import = time.perf_counter() - t0
    out = {"import_s": round(t_import, 2)}
    for i, (B, N, D) in enumerate([(1, 16384, 128), (2, 8192, 128), (16, 1024, 64)]):
        q = torch.randn(B, 16, N, D, device="cuda", dtype=torch.float16)
        torch.cuda.synchronize()
        t = time.perf_counter()
        torch_compile_attention(q, q, q, causal=False)
        torch.cuda.synchronize()
        out[f"call{i}_B{B}_N{N}_D{D}_s"] = round(time.perf_counter() - t, 2)
    from torch._dynamo.utils import counters

    out["inductor"] = {k: v for k, v in counters["inductor"].items() if "cache" in k}
    out["aot_autograd"] = {k: v for k, v in counters["aot_autograd"].items() if "cache" in k}
    print(json.dumps(out))


def main() -> None:
    dirs = {"pool": tempfile.mkdtemp(), "threads1": tempfile.mkdtemp()}
    for label, threads, cache in [("cold, pool", None, "pool"), ("warm, pool", None, "pool"),
                                  ("cold, 1 thread", "1", "threads1"),
                                  ("warm, 1 thread", "1", "threads1")]:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=dirs[cache],
                   TRITON_CACHE_DIR=os.path.join(dirs[cache], "triton"))
        if threads:
            env["TORCHINDUCTOR_COMPILE_THREADS"] = threads
        t = time.perf_counter()
        r = subprocess.run([sys.executable, __file__, "child"], env=env, capture_output=True,
                           text=True)
        last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-500:]
        print(f"{label}: process {time.perf_counter() - t:.1f} s {last}", flush=True)


def triton_child() -> None:
    """Seconds to launch each of flash fwd's D=128 configs once (compile, or load if cached)."""
    import os as _os
    import sys as _sys

    import torch

    from kernels.attention.flash_fwd import FWD_CONFIGS, flash_forward

    q = torch.randn(1, 16, 16384, 128, device="cuda", dtype=torch.float16)
    t = time.perf_counter()
    for cfg in FWD_CONFIGS[128]:
        flash_forward(q, q, q, True, config=cfg)
    torch.cuda.synchronize()
    print(json.dumps({"configs": len(FWD_CONFIGS[128]), "launch_all_s":
                      round(time.perf_counter() - t, 2), "dont_write_bytecode":
                      _sys.dont_write_bytecode, "torch_pyc": _os.path.exists(
                          __import__("importlib.util").util.cache_from_source(torch.__file__)),
                      "site_writable": _os.access(_os.path.dirname(torch.__file__), _os.W_OK)}))


def triton() -> None:
    """The same launches in two fresh processes sharing one Triton cache: cold, then warm."""
    d = tempfile.mkdtemp()
    env = dict(os.environ, TRITON_CACHE_DIR=d)
    for label in ("cold", "warm"):
        r = subprocess.run([sys.executable, __file__, "triton_child"], env=env,
                           capture_output=True, text=True)
        print(label, (r.stdout.strip().splitlines() or [r.stderr[-800:]])[-1], flush=True)


def profile() -> None:
    """Fill a cache in one process, then cProfile the first call in a second one."""
    d = tempfile.mkdtemp()
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=d, TRITON_CACHE_DIR=os.path.join(d, "t"),
               TORCHINDUCTOR_COMPILE_THREADS="1")
    subprocess.run([sys.executable, __file__, "child"], env=env, capture_output=True)
    code = ("import cProfile, pstats, torch, kernels; "
            "from kernels.attention.peers import torch_compile_attention as f; "
            "q = torch.randn(1, 16, 16384, 128, device='cuda', dtype=torch.float16); "
            "torch.cuda.synchronize(); pr = cProfile.Profile(); pr.enable(); "
            "f(q, q, q, causal=False); torch.cuda.synchronize(); pr.disable(); "
            "pstats.Stats(pr).sort_stats('cumulative').print_stats(45)")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    print(r.stdout[-9000:], r.stderr[-1500:])


if __name__ == "__main__":
    {"child": child, "profile": profile, "triton": triton, "triton_child": triton_child}.get((sys.argv[1:] or [""])[0], main)()
