"""Op `attention`: scaled dot-product attention softmax(Q K^T / sqrt(D)) V, optionally causal,
forward, backward or both.

Shapes: q, k, v, o, do, dq, dk, dv are (B, H, N, D); self-attention (as many keys as queries).
Modes: `fwd` measures o = attn(q, k, v); `bwd` runs the forward outside the measured region and
measures torch.autograd.grad(o, (q, k, v), do); `fwd_bwd` measures both (see `bind`).

FLOPs (matmul FLOPs only, FlashAttention-2 accounting):
    fwd      4 * B * H * N^2 * D         (Q K^T and P V, 2 * N^2 * D each), halved when causal
    bwd      2.5 * fwd                   (5 matmuls: S recomputed, dV, dP, dQ, dK)
    fwd_bwd  3.5 * fwd
Bytes (the fewest one call must move; e = B * H * N * D elements, s = itemsize):
    fwd      read q, k, v ; write o                         4 * e * s
    bwd      read q, k, v, o, do and lse (fp32, B*H*N) ; write dq, dk, dv
                                                            8 * e * s + 4 * B * H * N
    fwd_bwd  the sum of the two                             12 * e * s + 8 * B * H * N
             (the fp32 lse written by the forward and read by the backward)
Exponentials and the softmax bookkeeping are not counted (ncu does not count them as FLOPs).
"""
from __future__ import annotations

import torch

from harness.registry import Op, Param
from kernels._common import interpreted
from kernels.attention import flash, flash_bwd, flash_bwd_tma, flash_fwd, flash_fwd_tma
from kernels.attention import fused_mha as fused_mha_mod, peers
from kernels.attention import reference as ref

MODES = ("fwd", "bwd", "fwd_bwd")
BWD_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}

op = Op(
    "attention",
    params=[
        Param("B", int, help="batch", size=True),
        Param("H", int, help="heads", size=True),
        Param("N", int, help="sequence length (queries = keys)", size=True),
        Param("D", int, help="head dim"),
        Param("causal", bool, default=False, help="query i sees keys j <= i"),
        Param("mode", str, choices=MODES, default="fwd",
              help="fwd: o ; bwd: (dq, dk, dv) given o ; fwd_bwd: both"),
    ],
    dtypes=("float16", "bfloat16"),
    primary="tflops",
    description="scaled dot-product attention, (B, H, N, D), forward and/or backward",
)


@op.inputs
def make_inputs(p, dtype, device, gen):
    """q, k, v (+ do for backward modes), each (B, H, N, D) standard normal in `dtype`: the
    logits q.k/sqrt(D) then have unit spread, so the softmax is neither flat nor one-hot."""
    n = 3 if p.mode == "fwd" else 4
    return tuple(torch.randn(p.B, p.H, p.N, p.D, device=device, dtype=torch.float32,
                             generator=gen).to(dtype) for _ in range(n))


@op.reference
def chunked_reference(q, k, v, *, causal=False):
    """Chunked exact attention (kernels/attention/reference.py), in the inputs' dtype."""
    return ref.reference_forward(q, k, v, causal=causal)


# The binder computes the reference's gradients with this instead of autograd, so no graph
# holding O(N^2) probabilities is ever built for it.
chunked_reference.explicit_backward = ref.reference_backward


@op.flops
def flops(p):
    fwd = 4.0 * p.B * p.H * p.N * p.N * p.D
    if p.causal:
        fwd /= 2
    return fwd * BWD_FACTOR[p.mode]


@op.bytes
def nbytes(p, itemsize):
    e = p.B * p.H * p.N * p.D
    rows = p.B * p.H * p.N
    return {"fwd": 4.0 * e * itemsize,
            "bwd": 8.0 * e * itemsize + 4.0 * rows,
            "fwd_bwd": 12.0 * e * itemsize + 8.0 * rows}[p.mode]


@op.binder
def bind(fn, inputs, p, out):
    """The measured zero-argument call for `fn(q, k, v, causal=...) -> o` in mode p.mode.

    fwd      -> o
    bwd      -> (dq, dk, dv); the forward runs here, once, outside the measured call
    fwd_bwd  -> (o, dq, dk, dv)
    A function with an `explicit_backward(q, k, v, o, do, causal=)` attribute (the reference)
    gets its gradients from that instead of autograd.
    """
    causal = bool(p.causal)
    q, k, v = inputs[:3]
    if p.mode == "fwd":
        return lambda: fn(q, k, v, causal=causal)
    do = inputs[3]
    explicit = getattr(fn, "explicit_backward", None)
    if explicit is not None:
        if p.mode == "bwd":
            o = fn(q, k, v, causal=causal)
            return lambda: explicit(q, k, v, o, do, causal=causal)

        def ref_fwd_bwd():
            o = fn(q, k, v, causal=causal)
            return (o, *explicit(q, k, v, o, do, causal=causal))

        return ref_fwd_bwd
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    if p.mode == "bwd":
        with torch.enable_grad():
            o = fn(*leaves, causal=causal)

        def backward():
            with torch.enable_grad():
                return torch.autograd.grad(o, leaves, do, retain_graph=True)

        return backward

    def fwd_bwd():
        with torch.enable_grad():
            o = fn(*leaves, causal=causal)
            return (o.detach(), *torch.autograd.grad(o, leaves, do))

    return fwd_bwd


# -- availability -------------------------------------------------------------------------------

def _triton_unavailable(p, dtype, device):
    if p.D < 16 or p.D & (p.D - 1) or p.D > 128:
        return (f"Triton kernels need D a power of two (tl.dot) in [16, 128] (no tile configs "
                f"for larger heads), got D={p.D}")
    if device != "cuda" and not interpreted():
        return "Triton kernels on the CPU need the interpreter (TRITON_INTERPRET=1)"
    return None


def _forward_only(p, dtype, device):
    if p.mode != "fwd":
        return ("forward only: its backward would be naive's autograd over the same N x N "
                "matrices (measure `naive` for that)")
    return _triton_unavailable(p, dtype, device)


# -- implementations ----------------------------------------------------------------------------

op.impl("naive", backend="torch",
        description="textbook PyTorch: matmul, scale, mask, softmax, matmul; N x N in HBM; "
                    "backward by autograd")(ref.naive_attention)

op.impl("fused_mha", backend="triton", unavailable=_forward_only, expected_kernels=1,
        tuners=fused_mha_mod._tuner,
        description="one Triton kernel, scores still written to and read from an N x N fp32 "
                    "HBM scratch (fused, not flash); forward only")(fused_mha_mod.fused_mha)

op.impl("triton_flash", backend="triton", unavailable=_triton_unavailable,
        expected_kernels=lambda p: flash.kernels_launched(p.mode),
        tuners={"": flash_fwd._tuner, "dkdv": flash_bwd._dkdv_tuner, "dq": flash_bwd._dq_tuner},
        description="our FlashAttention in Triton: tiled online softmax, LSE saved, backward "
                    "by recomputation (delta, dK/dV, dQ kernels); on Hopper the Tuners also "
                    "time FA3-form Gluon kernels (forward; one-pass backward at D=128)")(
    flash.flash_attention)


def _tma_unavailable(p, dtype, device):
    return (_triton_unavailable(p, dtype, device) or flash_fwd_tma.unsupported(p.N, p.D)
            or (flash_bwd_tma.unsupported(p.N, p.D) if p.mode != "fwd" else None))


op.impl("triton_flash_tma", backend="triton", unavailable=_tma_unavailable,
        expected_kernels=lambda p: flash.kernels_launched(p.mode),
        tuners={"": flash_fwd_tma._tuner, "dkdv": flash_bwd_tma._dkdv_tuner,
                "dq": flash_bwd_tma._dq_tuner},
        description="triton_flash with every Q/K/V/dO tile and O/dQ/dK/dV store through Hopper "
                    "TMA descriptors; N a multiple of the tiles")(
    flash_fwd_tma.flash_attention_tma)

for _name in ("flash", "efficient", "cudnn"):
    op.impl(f"sdpa_{_name}", backend="library", unavailable=peers.sdpa_unavailable(_name),
            description=f"torch SDPA, {peers.BACKENDS[_name].name} backend only")(
        peers.sdpa(_name))

op.impl("torch_compile", backend="compile",
        description="torch.compile(naive): one graph per (D, causal, dtype, grad), B*H and N "
                    "dynamic")(peers.torch_compile_attention)
