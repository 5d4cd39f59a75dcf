"""Fused-op benchmark on one GPU: torch eager vs torch.compile vs the Triton kernels.

    PYTHONPATH=. python3 benchmarks/fused_bench.py                     # everything (< 4 min)
    PYTHONPATH=. python3 benchmarks/fused_bench.py --ops layernorm,mlp --dtypes float16
    PYTHONPATH=. python3 benchmarks/fused_bench.py --quick             # first shape only

For each op, at one or two large shapes and each dtype:
  1. the Triton implementation(s) are checked against the reference (harness.correctness.check,
     the harness's own tolerance rule, one trial);
  2. torch / torch_compile / triton are timed with triton.testing.do_bench (median of the
     samples; do_bench flushes the L2 before each sample, as the harness does);
  3. GB/s (memory-bound ops) or TFLOP/s (matmul ops) from the op's own bytes()/flops(), the
     percentage of a copy bandwidth measured here (1 GiB device-to-device copy, read + write),
     and the ratios vs eager and vs torch.compile.
The compact table comes last. `--dry-run` runs the same code on the CPU (Triton interpreter,
tiny shapes, wall-clock timing) to check the script itself; its numbers mean nothing.

The launch-configuration sweeps moved into the harness as experiments/tune/*_configs.yaml
(vector_add, layernorm, layernorm_bwd, add_layernorm, linear_gelu, mlp_fused, groupnorm_mish):
each configuration is a variant there, checked, timed, ncu-profiled and stored like any
candidate. What stays here is what a harness run does not print: every fused op in one process
in a few minutes, each rate as a percentage of a device-to-device copy measured in the same
process, and the cuBLAS GEMM alone next to the Triton matmul (how close the GEMM itself is).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

if "--dry-run" in sys.argv:  # before triton is imported: the interpreter is chosen then
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.correctness import TORCH_DTYPES, check  # noqa: E402
from harness.registry import Params, get_op  # noqa: E402
from kernels.mlp import triton_mlp  # noqa: E402

WARMUP_MS, REP_MS = 25, 100
DEVICE = "cuda"

# bench name -> (op, [shapes]); the first shape is the one --quick keeps
BENCHES: dict[str, tuple[str, list[dict]]] = {
    "vector_add": ("vector_add", [{"N": 2 ** 26}]),
    "layernorm": ("layernorm", [{"M": 8192, "N": 4096, "mode": "fwd"},
                                {"M": 16384, "N": 1024, "mode": "fwd"}]),
    "layernorm_bwd": ("layernorm", [{"M": 8192, "N": 4096, "mode": "bwd"}]),
    "add_layernorm": ("add_layernorm", [{"M": 8192, "N": 4096}]),
    "linear_gelu": ("linear_gelu", [{"M": 8192, "K": 4096, "N": 14336, "approximate": "none"}]),
    "mlp": ("mlp", [{"M": 8192, "D": 4096, "H": 14336, "approximate": "none"},
                    {"M": 262144, "D": 128, "H": 512, "approximate": "none"}]),
    "groupnorm_mish": ("groupnorm_mish", [{"N": 16, "C": 320, "H": 64, "W": 64, "G": 32},
                                          {"N": 4, "C": 320, "H": 128, "W": 128, "G": 32}]),
}


# --dry-run shapes: interpreter-sized, same code paths
DRY_SHAPES: dict[str, list[dict]] = {
    "vector_add": [{"N": 5000}],
    "layernorm": [{"M": 9, "N": 300, "mode": "fwd"}],
    "layernorm_bwd": [{"M": 9, "N": 300, "mode": "bwd"}],
    "add_layernorm": [{"M": 9, "N": 300}],
    "linear_gelu": [{"M": 40, "K": 64, "N": 48, "approximate": "none"}],
    "mlp": [{"M": 40, "D": 32, "H": 64, "approximate": "tanh"}],
    "groupnorm_mish": [{"N": 2, "C": 8, "H": 5, "W": 5, "G": 4}],
}


@dataclass
class Row:
    bench: str
    shape: str
    dtype: str
    impl: str
    ms: float
    rate: float  # GB/s or TFLOP/s
    unit: str
    pct_copy: float | None
    vs_eager: float | None
    vs_compile: float | None
    correct: str


def bench_ms(fn) -> float:
    """Median ms per call: do_bench on the GPU; three wall-clock calls in a dry run."""
    if DEVICE == "cuda":
        return float(triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=REP_MS,
                                             return_mode="median"))
    samples = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return sorted(samples)[1]


def copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device copy, counting the read and the write."""
    n = 2 ** 30 if DEVICE == "cuda" else 2 ** 20
    src = torch.empty(n, dtype=torch.uint8, device=DEVICE).random_(0, 255)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    del src, dst
    _empty_cache()
    return 2 * n / (ms * 1e-3)


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _empty_cache() -> None:
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


# -- one (bench, shape, dtype) ------------------------------------------------------------------

def run_case(bench: str, op_name: str, shape: dict, dtype: str, copy_bps: float
             ) -> tuple[list[Row], list[str]]:
    op = get_op(op_name)
    p = Params({pp.name: shape.get(pp.name, pp.default) for pp in op.params})
    tdtype = TORCH_DTYPES[dtype]
    shape_s = " ".join(f"{k}={v}" for k, v in shape.items())
    notes = [f"== {bench} {shape_s} {dtype}"]
    impls = [n for n in ("torch", "torch_compile", "triton", "triton_fused") if n in op.impls]
    impls = [n for n in impls if op.impls[n].reason_unavailable(p, dtype, DEVICE) is None]
    verdict = {}
    for name in impls:
        if op.impls[name].backend != "triton":
            continue
        res = check(op, op.impls[name], p, dtype, DEVICE, trials=1)
        verdict[name] = "yes" if res.correct else "NO"
        notes.append(f"  check {name}: {'ok' if res.correct else res.error} "
                     f"(max err {res.max_abs_err:.3g}, tol {res.tol:.3g})")
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    inputs = op.make_inputs(p, tdtype, DEVICE, gen)
    times = {}
    for name in impls:
        impl = op.impls[name]
        out = op.make_out(inputs, p) if impl.accepts_out else None
        fn = op.bind_impl(impl, inputs, p, out)
        fn()  # compile / tune outside the timed samples
        _sync()
        times[name] = bench_ms(fn)
    extra = {}
    if op_name == "linear_gelu" or (op_name == "mlp" and p.D > triton_mlp.MAX_FUSED_D):
        # the cuBLAS matmul alone (the up-projection for mlp): how close the Triton matmul is
        x, w, b = inputs[:3]
        label = "cublas F.linear" if op_name == "linear_gelu" else "cublas up-proj only"
        extra[label] = bench_ms(lambda: torch.nn.functional.linear(x, w, b))
    rows = []
    primary_tflops = op.primary == "tflops"
    flops = op.flop_count(p)
    nbytes = op.byte_count(p, tdtype.itemsize)
    for name, ms in times.items():
        if primary_tflops:
            rate, unit, pct = flops / (ms * 1e-3) / 1e12, "TFLOP/s", None
        else:
            bps = nbytes / (ms * 1e-3)
            rate, unit, pct = bps / 1e9, "GB/s", 100.0 * bps / copy_bps
        rows.append(Row(bench, shape_s, dtype, name, ms, rate, unit, pct,
                        times["torch"] / ms if "torch" in times else None,
                        times["torch_compile"] / ms if "torch_compile" in times else None,
                        verdict.get(name, "-")))
    for name, ms in extra.items():  # FLOPs of the one GEMM (no GELU, no second GEMM)
        f = 2.0 * inputs[0].shape[0] * inputs[1].shape[0] * inputs[0].shape[1]
        rows.append(Row(bench, shape_s, dtype, name, ms, f / (ms * 1e-3) / 1e12, "TFLOP/s",
                        None, None, None, "-"))
    del inputs
    _empty_cache()
    return rows, notes


def print_table(rows: list[Row], copy_bps: float) -> None:
    print()
    print(f"copy bandwidth (device copy, read + write): {copy_bps / 1e12:.2f} TB/s")
    head = (f"{'bench':<15}{'shape':<34}{'dtype':<10}{'impl':<20}{'ms':>9}{'rate':>10} "
            f"{'unit':<8}{'%copy':>6}{'xeager':>8}{'xcompile':>9}{'ok':>4}")
    print(head)
    print("-" * len(head))
    for r in rows:
        pct = f"{r.pct_copy:5.0f}%" if r.pct_copy is not None else "     -"
        ve = f"{r.vs_eager:7.2f}x" if r.vs_eager is not None else "       -"
        vc = f"{r.vs_compile:8.2f}x" if r.vs_compile is not None else "        -"
        print(f"{r.bench:<15}{r.shape[:33]:<34}{r.dtype:<10}{r.impl:<20}{r.ms:9.4f}"
              f"{r.rate:10.1f} {r.unit:<8}{pct}{ve}{vc}{r.correct:>4}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", default=",".join(BENCHES),
                    help=f"comma-separated, from: {', '.join(BENCHES)}")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--quick", action="store_true", help="first shape only")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU + Triton interpreter, tiny shapes: checks the script, not speed")
    a = ap.parse_args(argv)
    global DEVICE
    if a.dry_run:
        DEVICE = "cpu"
    elif not torch.cuda.is_available():
        print("fused_bench: needs a CUDA device (or --dry-run)", file=sys.stderr)
        return 2
    benches = [b.strip() for b in a.ops.split(",") if b.strip()]
    unknown = [b for b in benches if b not in BENCHES]
    if unknown:
        print(f"fused_bench: unknown op(s) {unknown}; choose from {', '.join(BENCHES)}",
              file=sys.stderr)
        return 2
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU dry run (interpreter)"
    print(f"{where} | torch {torch.__version__} | triton {triton.__version__}", flush=True)
    copy_bps = copy_bandwidth()
    print(f"copy bandwidth: {copy_bps / 1e12:.2f} TB/s", flush=True)
    rows: list[Row] = []
    failures = 0
    t_all = time.time()
    for bench in benches:
        op_name, shapes = BENCHES[bench]
        if a.dry_run:
            shapes = DRY_SHAPES[bench]
        for shape in shapes[:1] if a.quick else shapes:
            for dtype in dtypes:
                t0 = time.time()
                try:
                    r, notes = run_case(bench, op_name, shape, dtype, copy_bps)
                except Exception:
                    failures += 1
                    print(f"== {bench} {shape} {dtype}: FAILED\n{traceback.format_exc()}",
                          flush=True)
                    continue
                rows += r
                print("\n".join(notes) + f"\n  ({time.time() - t0:.1f} s)", flush=True)
    print_table(rows, copy_bps)
    print(f"total {time.time() - t_all:.0f} s; {failures} case(s) failed")
    return 1 if failures or any(r.correct == "NO" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
