"""`flash_attention(q, k, v, causal)`: the Triton FlashAttention forward and backward kernels
behind one torch.autograd.Function.

Saved for backward: q, k, v, o (B, H, N, D) and the base-2 log-sum-exp (B, H, N) fp32 -- no
N x N matrix. Backward recomputes P from them (kernels/attention/flash_bwd.py).
"""
from __future__ import annotations

import torch

from kernels.attention.flash_bwd import flash_backward
from kernels.attention.flash_fwd import flash_forward


def attention_function(forward, backward, name: str) -> type[torch.autograd.Function]:
    """A torch.autograd.Function pairing `forward(q, k, v, causal) -> (o, lse)` with
    `backward(q, k, v, o, lse, do, causal) -> (dq, dk, dv)`; it saves q, k, v, o and the LSE."""

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal: bool):
            o, lse = forward(q, k, v, causal)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.causal = causal
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            dq, dk, dv = backward(q, k, v, o, lse, do, ctx.causal)
            return dq, dk, dv, None

    Fn.__name__ = Fn.__qualname__ = name
    return Fn


FlashAttention = attention_function(flash_forward, flash_backward, "FlashAttention")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                    causal: bool = False) -> torch.Tensor:
    """Attention o (B, H, N, D) for q, k, v (B, H, N, D) fp16/bf16; differentiable."""
    return FlashAttention.apply(q, k, v, causal)


def kernels_launched(mode: str) -> int:
    """Kernels per measured call: forward 1; backward 3 (delta, dK/dV, dQ; or, in the
    one-pass Gluon plan, delta with the dQ ring's zeroing, the one-pass kernel, the copy of the
    last heads' dQ)."""
    return {"fwd": 1, "bwd": 3, "fwd_bwd": 4}[mode]


# The Tuners fold in second and third forms that flash_fwd / flash_bwd import lazily (each
# imports their helpers, and flash_fwd_tma this module's attention_function): named here, after
# everything they need, so that provenance's walk from triton_flash (this module's
# flash_attention) reaches their kernels and a change to them changes its code hash.
from kernels.attention import (flash_bwd_gluon, flash_bwd_tma, flash_fwd_gluon,  # noqa: E402,F401
                               flash_fwd_tma)
