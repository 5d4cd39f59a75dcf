"""Attention on the GPU, outside the harness: is triton_flash correct and how fast is it next to
the SDPA kernels, over the whole N range? One device call, under 4 minutes.

    PYTHONPATH=. python3 benchmarks/attention_bench.py                   # everything below
    PYTHONPATH=. python3 benchmarks/attention_bench.py --modes fwd --d 128 --causal 0

Launch-configuration sweeps moved into the harness: experiments/tune/flash_fwd_configs.yaml
and flash_bwd_configs.yaml (each config a variant: checked, timed, ncu-profiled, stored), and
every harness run records the configuration the Tuner chose per case (results `config`). What
stays here is what a harness run does not give in one go: a single process that walks every
(mode, D, causal, N) under a wall-clock budget and prints one compact TFLOP/s table with the
ratios to the peers, plus the peak-memory ratio of the forward -- a quick survey before the
harness runs (experiments/flash.yaml, flash_bwd.yaml) that measure the same shapes properly.

Shapes: 16k tokens (B = 16384 / N), H = 16, N in 2048..16384, D 64 and 128, causal and not,
fp16, forward and backward (the backward measured as autograd.grad with the forward done
beforehand: the op's own binder, exactly as the harness measures it).

Output, in order: one line per shape as it is measured (correctness of triton_flash by the
harness rule, peak memory); last, the compact table of TFLOP/s (median of
triton.testing.do_bench, L2 flushed) and triton_flash's ratios to sdpa_flash, sdpa_cudnn and
naive.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import triton
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.correctness import compare  # noqa: E402
from harness.registry import Params  # noqa: E402
from kernels.attention import op  # noqa: E402

TOKENS, HEADS = 16384, 16
DEFAULT_IMPLS = "triton_flash,sdpa_flash,sdpa_cudnn,naive"


def params(mode, D, causal, N) -> Params:
    return Params(B=TOKENS // N, H=HEADS, N=N, D=D, causal=causal, mode=mode)


def inputs_for(p: Params, dtype, seed=0):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    return op.make_inputs(p, dtype, "cuda", gen)


def bench_ms(fn, rep: int) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def tflops(p: Params, ms: float) -> float:
    return op.flop_count(p) / (ms * 1e-3) / 1e12


def check(p: Params, dtype) -> str:
    """triton_flash vs the chunked fp32 reference, by the harness rule (2x torch's error)."""
    inputs = inputs_for(p, dtype, seed=1)
    out = op.bind_impl(op.get_impl("triton_flash"), inputs, p)()
    lo = op.run_reference(inputs, p)
    hi = op.run_reference(tuple(x.float() for x in inputs), p)
    f, reason = compare(out, hi, lo, dtype, 2.0)
    ratio = f["max_abs_err"] / max(f["tol"], 1e-30)
    return f"{'ok' if reason is None else 'FAIL'} err/tol {ratio:.2f}" + \
        ("" if reason is None else f" ({reason})")


def peak_ratio(p: Params, dtype) -> float:
    """Peak bytes during one triton_flash forward (inputs included) / bytes of q, k, v and o."""
    fp = params("fwd", p.D, p.causal, p.N)
    q, k, v = inputs_for(fp, dtype)
    fn = op.bind_impl(op.get_impl("triton_flash"), (q, k, v), fp)
    fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    o = fn()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    e = q.numel() * q.element_size()
    del o
    return (3 * e + extra) / (4 * e)


def measure(p: Params, impl: str, dtype, rep: int):
    """(TFLOP/s, note); TFLOP/s is None when the impl cannot run or fails."""
    im = op.get_impl(impl)
    reason = im.reason_unavailable(p, str(dtype).replace("torch.", ""), "cuda")
    if reason:
        return None, f"skip: {reason}"
    try:
        fn = op.bind_impl(im, inputs_for(p, dtype), p)
        fn()  # compile / tune outside the timing
        torch.cuda.synchronize()
        return tflops(p, bench_ms(fn, rep)), ""
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None, "OOM"
    except Exception as exc:  # report and go on: this script is a survey
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="fwd,bwd")
    ap.add_argument("--d", default="64,128")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--n", default="2048,4096,8192,16384")
    ap.add_argument("--impls", default=DEFAULT_IMPLS,
                    help=f"comma-separated (default {DEFAULT_IMPLS}; also sdpa_efficient, "
                         f"fused_mha, torch_compile)")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--budget-s", type=float, default=180.0,
                    help="stop starting new shapes after this many seconds")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, a.dtype)
    modes = a.modes.split(",")
    dims = [int(x) for x in a.d.split(",")]
    causals = [bool(int(x)) for x in a.causal.split(",")]
    ns = [int(x) for x in a.n.split(",")]
    impls = a.impls.split(",")
    t0 = time.time()
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | triton "
          f"{triton.__version__} | {a.dtype} | H={HEADS} | B*N={TOKENS}", flush=True)
    table = []
    # D=128 first (the headline shapes), so a spent budget cuts D=64 rather than them
    order = [(m, d, c) for d in sorted(dims, reverse=True) for c in causals for m in modes]
    for mode, D, causal in order:
        for N in ns:
            if time.time() - t0 > a.budget_s:
                print(f"budget of {a.budget_s:.0f}s spent: skipping {mode} D={D} "
                      f"causal={causal} N={N}", flush=True)
                continue
            p = params(mode, D, causal, N)
            row = {"mode": mode, "D": D, "causal": causal, "N": N}
            notes = []
            for impl in impls:
                tf, note = measure(p, impl, dtype, a.rep)
                row[impl] = tf
                if note:
                    notes.append(f"{impl}: {note}")
            info = []
            if not a.no_check:
                info.append(check(p, dtype))
            if mode == "fwd":
                info.append(f"peak/(q+k+v+o) {peak_ratio(p, dtype):.3f}")
            print(f"{mode:3s} D={D:3d} causal={int(causal)} N={N:5d} | " + " | ".join(info) +
                  ("" if not notes else " | " + "; ".join(notes)), flush=True)
            table.append(row)
            torch.cuda.empty_cache()
    _print_table(table, impls)
    print(f"# {time.time() - t0:.0f} s")
    return 0


def _print_table(table, impls) -> None:
    ratio_to = [x for x in ("sdpa_flash", "sdpa_cudnn", "naive") if x in impls]
    head = f"{'mode':4s} {'D':>3s} {'c':>1s} {'N':>5s} " + \
        " ".join(f"{i[:12]:>12s}" for i in impls) + \
        "".join(f" {'x' + r[:10]:>11s}" for r in ratio_to)
    print("\nTFLOP/s (median, L2 flushed); x<peer> = triton_flash / peer")
    print(head)
    print("-" * len(head))
    for r in table:
        cells = " ".join(f"{r[i]:12.1f}" if r.get(i) else f"{'-':>12s}" for i in impls)
        mine = r.get("triton_flash")
        ratios = "".join(f" {mine / r[x]:11.2f}" if mine and r.get(x) else f" {'-':>11s}"
                         for x in ratio_to)
        print(f"{r['mode']:4s} {r['D']:3d} {int(r['causal']):1d} {r['N']:5d} {cells}{ratios}")


if __name__ == "__main__":
    sys.exit(main())
