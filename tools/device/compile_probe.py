"""Where a worker's first seconds go (device): imports, and torch.compile's first graph in a
fresh process, cold and warm on-disk caches, with and without Inductor's compile-worker pool.

    python3 tools/device/compile_probe.py           # prints one line per fresh process
    python3 tools/device/compile_probe.py profile   # where a warm-cache first call's seconds go
    python3 tools/device/compile_probe.py triton    # flash fwd configs: cold vs warm Triton cache
    python3 tools/device/compile_probe.py warmcache # compile-ahead's Tuner compile, then the
                                                  # check's Tuner: seconds per kernel class

Every profiler pass starts a new worker, so a one-time cost per process is paid three times
per run (check/time, ncu, nsys). This probe is what decides the worker's Inductor settings
(harness.execute.executors.process.worker_env).
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


CLASSES = [(D, causal, dt) for D in (128, 64) for causal in (False, True)
           for dt in ("float16", "bfloat16")]


def warmcache_child(phase: str) -> None:
    """phase warm: each class's Tuners in compile-only mode (what a compile-ahead worker does);
    tune: the Tuners as the check pass runs them (seconds compiling/loading vs timing);
    load: every candidate launched one by one on this thread (seconds each, or its error)."""
    import torch

    from harness import tuning
    from kernels.attention import flash_fwd_tma
    from kernels.attention.flash_fwd import configs_for, flash_forward
    from kernels.attention.fused_mha import fused_mha

    out = {}
    for D, causal, dt in CLASSES:
        q = torch.randn(4, 16, 4096, D, device="cuda", dtype=getattr(torch, dt))
        key = f"D{D} {'causal' if causal else 'full'} {dt}"
        t = time.perf_counter()
        if phase == "warm":
            with tuning.compile_only():
                flash_forward(q, q, q, causal)
                fused_mha(q, q, q, causal=causal)
            torch.cuda.synchronize()
            out[key] = round(time.perf_counter() - t, 2)
        elif phase == "tune":
            with tuning.recording() as log:
                flash_forward(q, q, q, causal)
            with tuning.recording() as log2:
                fused_mha(q, q, q, causal=causal)
            out[key] = {"flash_compile_s": round(log.compile_s, 2),
                        "flash_timing_s": round(log.timing_s, 2),
                        "fused_compile_s": round(log2.compile_s, 2),
                        "fused_timing_s": round(log2.timing_s, 2)}
        else:
            per = {}
            cands = [(*c, 0) for c in configs_for(D)] + \
                [(*c, 1) for c in flash_fwd_tma.configs_for(D, 4096)]
            for c in cands:
                t = time.perf_counter()
                try:
                    flash_forward(q, q, q, causal, config=c)
                    torch.cuda.synchronize()
                    per[str(c)] = round(time.perf_counter() - t, 3)
                except Exception as e:  # noqa: BLE001 (the probe reports every failure)
                    per[str(c)] = f"{type(e).__name__}: {str(e)[:300]}"
            out[key] = per
    print(json.dumps(out))


def warmcache() -> None:
    """Compile-ahead then check, as a run does them, in fresh processes sharing one new Triton
    cache: does the check pass find compile-ahead's kernels?"""
    d = tempfile.mkdtemp()
    env = dict(os.environ, TRITON_CACHE_DIR=d)
    for phase in ("warm", "tune", "load", "tune"):
        t = time.perf_counter()
        r = subprocess.run([sys.executable, __file__, "warmcache_child", phase], env=env,
                           capture_output=True, text=True)
        last = (r.stdout.strip().splitlines() or [r.stderr[-1500:]])[-1]
        print(f"== {phase}: process {time.perf_counter() - t:.1f} s, Triton cache entries "
              f"after it {len(os.listdir(d))}\n{last}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["warmcache_child"]:
        warmcache_child(sys.argv[2])
        sys.exit(0)
    {"child": child, "profile": profile, "triton": triton, "triton_child": triton_child,
     "warmcache": warmcache}.get((sys.argv[1:] or [""])[0], main)()
