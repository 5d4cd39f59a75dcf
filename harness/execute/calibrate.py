"""`harness calibrate`: measure the ceilings the roofline is drawn against, per GPU.

    copy_gbps        device-to-device copy of 1 GiB, bytes read + bytes written per second
    copy_curve       [[bytes read + written, GB/s], ...]: copies of COPY_CURVE_MIB, each timed
                     as a case is (L2 flushed before every launch, CUDA events, warm-up): the
                     rate a memory-bound kernel of that size can hope for (roofline.py)
    matmul_tflops    torch.mm 8192^3 in float16 and bfloat16 (tensor cores, cuBLAS)
    fma_tflops_fp32  a Triton kernel of independent FMA chains in registers (2 FLOP per FMA)

Measured in a worker subprocess (the CLI process never initialises CUDA); the result is cached
in <store>/.calibration/<gpu>.json and used by every later run on that GPU.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from harness.errors import HarnessError
from harness.store.option import add_store_argument

HELP = "measure the GPU's ceilings (copy GB/s, matmul and FMA TFLOP/s) for the roofline"
COPY_CURVE_MIB = (4, 8, 16, 32, 64, 128, 256, 512)  # MiB read (and written) per copy


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_store_argument(p, out_alias=True,
                       help="store root where the result is cached (default: runs/)")


def _fma_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def fma_chains(x_ptr, y_ptr, ITERS: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        a = tl.load(x_ptr + offs)
        b = a * 0.5 + 1.0
        c = a * 0.25 + 2.0
        d = a * 0.125 + 3.0
        for _ in range(ITERS):  # 4 independent chains: 4 FMAs per iteration per element
            a = a * 0.999 + 0.001
            b = b * 0.999 + 0.001
            c = c * 0.999 + 0.001
            d = d * 0.999 + 0.001
        tl.store(y_ptr + offs, a + b + c + d)

    return fma_chains


def measure() -> dict:
    import torch

    from harness.execute.timing import TIMING_METHOD, bench

    def ms(fn):
        return bench(fn, device="cuda", warmup_ms=50, rep_ms=300, flush_l2=False,
                     min_samples=20).median

    out: dict = {}
    n = 1 << 29  # 512 Mi fp16 elements = 1 GiB
    x = torch.empty(n, dtype=torch.float16, device="cuda").normal_()
    y = torch.empty_like(x)
    out["copy_gbps"] = 2 * x.numel() * 2 / (ms(lambda: y.copy_(x)) * 1e-3) / 1e9
    out["copy_curve"] = []
    for mib in COPY_CURVE_MIB:
        n = mib << 19  # fp16 elements
        src, dst = x[:n], y[:n]
        t = bench(lambda: dst.copy_(src), device="cuda", warmup_ms=25, rep_ms=100,
                  flush_l2=True, min_samples=20).median
        out["copy_curve"].append([4 * n, 4 * n / (t * 1e-3) / 1e9])
    del x, y
    out["matmul_tflops"] = {}
    for name, dt in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        s = 8192
        a = torch.randn(s, s, device="cuda", dtype=dt)
        b = torch.randn(s, s, device="cuda", dtype=dt)
        out["matmul_tflops"][name] = 2 * s ** 3 / (ms(lambda: torch.mm(a, b)) * 1e-3) / 1e12
        del a, b
    kern = _fma_kernel()
    block, iters = 1024, 4096
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    numel = sms * 16 * block
    xa = torch.rand(numel, device="cuda", dtype=torch.float32)
    ya = torch.empty_like(xa)
    t = ms(lambda: kern[(numel // block,)](xa, ya, ITERS=iters, BLOCK=block, num_warps=8))
    out["fma_tflops_fp32"] = 2 * 4 * iters * numel / (t * 1e-3) / 1e12
    props = torch.cuda.get_device_properties(0)
    out.update(gpu_name=props.name, sm_count=sms, torch=torch.__version__,
               timing_method=TIMING_METHOD,
               measured_utc=datetime.now(timezone.utc).isoformat())
    return out


def _cached(root: str | Path, gpu_name: str | None, console=None) -> dict | None:
    """The cached ceilings of `gpu_name` if they were timed as this harness times a case."""
    from harness import store
    from harness.execute.timing import TIMING_METHOD

    cal = store.load_calibration(gpu_name, root)
    if cal is not None and cal.get("timing_method") != TIMING_METHOD:
        # the copy curve is timed as a case is: a curve taken by another method would place
        # this run's cases against ceilings its own timing does not share
        if console is not None:
            console.print(f"re-calibrating {gpu_name}: the cached ceilings were timed by "
                          f"{cal.get('timing_method') or 'an older method'}")
        cal = None
    return cal


class Measurement:
    """The measuring subprocess, pinned to `gpu` (None: the one the run sees). Started before
    a run's end, on a GPU of the run that has done its last case (Runner.gpu_idle), its
    start-up and its measurement overlap the run's tail (a profiler writing its report, the
    exports, another GPU still profiling) instead of following it; `ensure(..., early=)`
    waits for it and keeps what it measured if it ran on a GPU of the run's model, else
    `calibrate` starts one and waits."""

    def __init__(self, gpu: int | None) -> None:
        from harness.execute.executors.process import worker_env

        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name) / "cal.json"
        self.err = open(Path(self.dir.name) / "stderr.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.execute.calibrate", str(self.path)],
            env=worker_env("cuda", gpu), stdout=subprocess.DEVNULL, stderr=self.err)

    def result(self) -> tuple[int, dict | None, str]:
        """(exit code, the measurement or None, the last line of its stderr)."""
        rc = self.proc.wait()
        self.err.seek(0)
        tail = (self.err.read().strip().splitlines() or ["no output"])[-1]
        try:
            data = json.loads(self.path.read_text()) if rc == 0 else None
        except (OSError, ValueError):  # none written, or cut short: measured again after
            data = None
        self.err.close()
        self.dir.cleanup()
        return rc, data, tail


def ensure(root: str | Path, gpu_name: str | None, console,
           early: Measurement | None = None) -> dict | None:
    """The cached ceilings for this GPU, measuring them once if missing (GPU runs only);
    `early`: a Measurement started before the run's end."""
    cal = _cached(root, gpu_name, console)
    if cal is None and gpu_name:
        console.print(f"calibrating the roofline ceilings of {gpu_name} (once per GPU; "
                      "`harness calibrate` to redo)")
        try:
            cal = calibrate(root, console, early)
        except HarnessError as exc:
            console.print(f"[yellow]calibration skipped:[/] {exc}")
    return cal


def start_early(root: str | Path, gpu_name: str | None, gpu: int | None) -> Measurement | None:
    """A Measurement on `gpu` if `gpu_name` has no usable cached ceilings, else None."""
    return Measurement(gpu) if gpu_name and _cached(root, gpu_name) is None else None


def calibrate(root: str | Path, console, early: Measurement | None = None) -> dict:
    from harness import store
    from harness.machine import env

    present, why = env.cuda_device_present()
    if not present:
        raise HarnessError(f"calibrate needs a CUDA device ({why})")
    fp = env.fingerprint("cuda")
    gpu = fp.get("gpu_name")
    rc, data, tail = early.result() if early is not None else (1, None, "")
    if rc != 0 or data is None or (gpu and data.get("gpu_name") != gpu):  # measure it now
        rc, data, tail = Measurement(None).result()
        if rc != 0 or data is None:
            raise HarnessError(f"calibration failed (exit {rc}): {tail}")
    gpu = gpu or data["gpu_name"]
    data["driver"] = fp.get("driver")
    saved = store.save_calibration(root, gpu, data)
    curve = " ".join(f"{b / 2 ** 20:.0f}M:{g:,.0f}" for b, g in data.get("copy_curve", []))
    console.print(f"[bold]{gpu}[/]: copy {data['copy_gbps']:,.0f} GB/s"
                  + (f" (by bytes moved: {curve})" if curve else "") + " · matmul fp16 "
                  f"{data['matmul_tflops']['float16']:.0f} / bf16 "
                  f"{data['matmul_tflops']['bfloat16']:.0f} TFLOP/s · fp32 FMA "
                  f"{data['fma_tflops_fp32']:.1f} TFLOP/s")
    console.print(f"cached at {saved}")
    return store.load_calibration(gpu, root)


def main(a, console) -> int:
    calibrate(a.store, console)
    return 0


if __name__ == "__main__":  # the measuring subprocess
    Path(sys.argv[1]).write_text(json.dumps(measure(), indent=2))
