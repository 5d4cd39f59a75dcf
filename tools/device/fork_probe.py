"""What a compile-ahead worker's first class costs in a fresh process against one forked from a
process that imported torch, Triton, Inductor and the kernels already (device).

    python3 tools/device/fork_probe.py [N ...]   # N workers side by side (default 8 16)

For each N, two modes one after the other, each with fresh Triton and Inductor cache folders:
`fresh` (N new processes, as compile-ahead starts them) and `fork` (N children of one process
that imported torch, triton, the kernels and torch.compile's modules, started before the clock:
its own import seconds are printed apart). Worker k of N compiles one class, compile-only: k < 8
torch.compile's class k (D, causal, dtype), the others a Triton class of fused_mha or
triton_flash; then, where it compiled torch.compile, a second class (the one worker k + 4
compiles first). GPUs round robin. Prints one JSON line per worker and one per mode (the last
worker's end from the start). The fork needs torch's NVML availability check
(PYTORCH_NVML_BASED_CUDA_CHECK=1): Inductor's import asks whether CUDA is there, and through
the CUDA runtime that initialises the driver, which a forked child then cannot use.
Measured (2x H200, 32 cores, docs/measurement.md, fifteenth session): forked workers end
earlier here, but compile-ahead's phase with its workers forked from a server started with the
run took longer than with fresh workers.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

SHAPES = [(d, c, dt) for d in (64, 128) for c in (False, True) for dt in ("float16", "bfloat16")]


def imports() -> None:
    import torch  # noqa: F401
    import triton  # noqa: F401

    import harness.execute.worker  # noqa: F401
    import kernels  # noqa: F401
    from harness.registry import registry
    registry()


def compile_class(k: int, impl_name: str) -> float:
    import torch

    from harness import tuning
    from harness.registry import Params, get_op

    d, causal, dt = SHAPES[k % len(SHAPES)]
    op = get_op("attention")
    impl = op.get_impl(impl_name)
    params = Params({"B": 4, "N": 4096, "D": d, "causal": causal, "H": 16, "mode": "fwd"})
    gen = torch.Generator(device="cuda")
    gen.manual_seed(k)
    t = time.perf_counter()
    with tuning.compile_only():
        inputs = op.make_inputs(params, getattr(torch, dt), "cuda", gen)
        out = op.make_out(inputs, params) if impl.accepts_out else None
        op.bind_impl(impl, inputs, params, out)()
        torch.cuda.synchronize()
    return time.perf_counter() - t


def work(k: int, t0: float) -> dict:
    began = time.time() - t0
    t = time.perf_counter()
    imports()
    rec = {"k": k, "began_s": round(began, 2), "import_s": round(time.perf_counter() - t, 2)}
    if k < 8:
        rec["first_s"] = round(compile_class(k, "torch_compile"), 2)
        rec["second_s"] = round(compile_class((k + 4) % 8, "torch_compile"), 2)
    else:
        rec["first_s"] = round(compile_class(k, "fused_mha" if k % 2 else "triton_flash"), 2)
    rec["end_s"] = round(time.time() - t0, 2)
    return rec


def zygote() -> None:
    t = time.perf_counter()
    imports()
    import torch._dynamo  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    import torch
    ready = {"zygote_s": round(time.perf_counter() - t, 2),
             "cuda_initialized": torch.cuda.is_initialized(),
             "threads": len(os.listdir("/proc/self/task"))}
    print(json.dumps(ready), flush=True)
    kids = []
    for line in sys.stdin:
        k, gpu, t0 = line.split()
        pid = os.fork()
        if pid == 0:
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu
            try:
                rec = work(int(k), float(t0))
                print(json.dumps(rec), flush=True)
                code = 0
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        kids.append(pid)
    for pid in kids:
        os.waitpid(pid, 0)


def main(ns: list[int]) -> None:
    import torch

    from harness.execute import pycache

    gpus = torch.cuda.device_count()
    base = tempfile.mkdtemp(prefix="forkprobe")
    me = os.path.abspath(__file__)
    # bytecode kept as the harness keeps it, written once by a warm-up process; NVML's check
    # (the module doc says why)
    common = pycache.apply_to_env({**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1",
                                   "PYTHONUNBUFFERED": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"})
    t = time.time()
    subprocess.run([sys.executable, me, "child", "0", str(t)],
                   env={**common, "TRITON_CACHE_DIR": f"{base}/warm/triton",
                        "TORCHINDUCTOR_CACHE_DIR": f"{base}/warm/inductor",
                        "CUDA_VISIBLE_DEVICES": "0"}, check=True)
    print(json.dumps({"warmup_s": round(time.time() - t, 2)}), flush=True)
    for n in ns:
        for mode in ("fresh", "fork"):
            tag = f"{mode}{n}"
            env = {**common, "TRITON_CACHE_DIR": f"{base}/{tag}/triton",
                   "TORCHINDUCTOR_CACHE_DIR": f"{base}/{tag}/inductor"}
            if mode == "fresh":
                t0 = time.time()
                procs = [subprocess.Popen(
                    [sys.executable, me, "child", str(k), str(t0)],
                    env={**env, "CUDA_VISIBLE_DEVICES": str(k % gpus)}, stdout=subprocess.PIPE,
                    text=True) for k in range(n)]
                outs = [p.communicate()[0] for p in procs]
            else:
                z = subprocess.Popen([sys.executable, me, "zygote"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
                print(json.dumps({"mode": tag, **json.loads(z.stdout.readline())}), flush=True)
                t0 = time.time()
                z.stdin.write("".join(f"{k} {k % gpus} {t0}\n" for k in range(n)))
                z.stdin.close()
                outs = [z.stdout.read()]
                z.wait()
            recs = [json.loads(x) for o in outs for x in o.splitlines() if x.startswith("{")]
            for r in sorted(recs, key=lambda r: r["k"]):
                print(json.dumps({"mode": tag, **r}), flush=True)
            print(json.dumps({"mode": tag, "workers": len(recs),
                              "last_end_s": max((r["end_s"] for r in recs), default=None)}),
                  flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        print(json.dumps(work(int(sys.argv[2]), float(sys.argv[3]))), flush=True)
    elif sys.argv[1:2] == ["zygote"]:
        zygote()
    else:
        main([int(x) for x in sys.argv[1:]] or [8, 16])
