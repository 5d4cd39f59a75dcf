"""First light of the Gluon FA3-form forward (kernels/attention/flash_fwd_gluon.py) on a Hopper
GPU: is each variant correct, and roughly how fast, before it is offered to the Tuner? A probe,
not the measurement: the figures that count come from `python -m harness run
experiments/flash.yaml` (the Tuner times the Gluon configs beside the TMA ones).

    python3 tools/device/gluon_fwd_check.py [--quick | --small] [--dims 64] [--default]
                                                                   (device: sm_90)

Per shape (16k tokens, H=16, as experiments/flash.yaml) and variant (OVERLAP x PINGPONG) x
config: the largest |o - o_ref| (o_ref: SDPA's math backend in fp32 on the same inputs) next to
the TMA kernel's, the largest |lse - lse_tma| (the backward reads LSE), and TFLOP/s from the
Tuners' own timing (L2-flushed CUDA-event medians), beside SDPA's flash and cuDNN backends.
"""
from __future__ import annotations

import argparse
import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels._tuner import Tuner
from kernels.attention import flash_fwd_gluon as fg
from kernels.attention import flash_fwd_tma

VARIANTS = ((False, False), (True, False), (False, True), (True, True))  # (overlap, pingpong)


_TIMER = Tuner("gluon_fwd_check")


def timed(fn) -> float:
    """Median ms of L2-flushed launches of `fn`, the way the Tuners time a candidate
    (Tuner.measure: CUDA events, the host's launch time hidden)."""
    fn()
    return _TIMER.measure(lambda _: fn(), None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="N=4096 only, fp16")
    ap.add_argument("--small", action="store_true",
                    help="the edges: N = 128 (one query tile, one key tile), 256, 384; H=3")
    ap.add_argument("--dims", type=int, nargs="+", default=[128, 64], help="head dims")
    ap.add_argument("--default", action="store_true",
                    help="only the variant the Tuner's TMA: 4 launches (OVERLAP, no PINGPONG)")
    a = ap.parse_args(argv)
    variants = [(True, False)] if a.default else VARIANTS
    H = 3 if a.small else 16
    shapes = ([(2, 128), (1, 256), (3, 384)] if a.small else [(4, 4096)] if a.quick
              else [(8, 2048), (4, 4096), (1, 16384)])
    dtypes = [torch.float16] if a.quick else [torch.float16, torch.bfloat16]
    bad = 0
    for dtype in dtypes:
        for D in a.dims:
            for causal in (False, True):
                for B, N in shapes:
                    gen = torch.Generator(device="cuda").manual_seed(0)
                    q, k, v = (torch.randn(B, H, N, D, device="cuda", generator=gen).to(dtype)
                               for _ in range(3))
                    flops = 4.0 * B * H * N * N * D / (2 if causal else 1)
                    with sdpa_kernel([SDPBackend.MATH]):
                        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                             is_causal=causal)
                    o_tma, lse_tma = flash_fwd_tma.flash_forward_tma(q, k, v, causal)
                    err_tma = (o_tma.float() - ref).abs().max().item()
                    line = [f"{str(dtype)[6:]:8s} D={D:<3d} causal={causal!s:5s} B={B} N={N:<5d}"]
                    for name, be in (("flash", SDPBackend.FLASH_ATTENTION),
                                     ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                        try:
                            with sdpa_kernel([be]):
                                ms = timed(lambda: F.scaled_dot_product_attention(
                                    q, k, v, is_causal=causal))
                            line.append(f"{name} {flops / ms / 1e9:6.1f}")
                        except RuntimeError as e:
                            line.append(f"{name} n/a ({str(e)[:40]})")
                    line.append(f"tma {flops / timed(lambda: flash_fwd_tma.flash_forward_tma(q, k, v, causal)) / 1e9:6.1f} err {err_tma:.2e}")
                    print("  ".join(line), flush=True)
                    o = torch.empty_like(q)
                    lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
                    launch = fg.gluon_launcher(q, k, v, o, lse, causal)
                    for cfg in fg.configs_for(D, N):
                        for overlap, pingpong in variants:
                            o.fill_(float("nan"))
                            lse.fill_(float("nan"))
                            launch(cfg, overlap, pingpong)
                            torch.cuda.synchronize()
                            err = (o.float() - ref).abs().max().item()
                            lerr = (lse - lse_tma).abs().max().item()
                            ok = err <= 2 * err_tma + 1e-3 and lerr < 1e-2 and not math.isnan(err)
                            bad += not ok
                            ms = timed(lambda: launch(cfg, overlap, pingpong))
                            print(f"    gluon {cfg} overlap={overlap!s:5s} pingpong={pingpong!s:5s}"
                                  f" {flops / ms / 1e9:6.1f} TFLOP/s  err {err:.2e}  lse {lerr:.1e}"
                                  f"  {'ok' if ok else 'WRONG'}", flush=True)
    print(f"{bad} wrong", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
