"""Transformer MLP y = GELU(x @ W1^T + b1) @ W2^T + b2 in Triton, two ways.

    x: (M, D)   W1: (H, D)   b1: (H,)   W2: (D, H)   b2: (D,)   y: (M, D)

`mlp_two_kernels` (any shape): kernel 1 is the linear_gelu matmul with bias + GELU in its
epilogue, writing the activated intermediate h (M, H) once in the input dtype; kernel 2 is the
same matmul with only the bias epilogue, reading h back. The pre-activation never reaches HBM;
h does, once each way (2·M·H·itemsize). At transformer shapes (D = 4096, H = 11008..14336)
that is ~4 % of the kernel time, because the matmuls are compute-bound.

`mlp_fused` (small D only, D <= MAX_FUSED_D): one kernel. A program owns BLOCK_M rows and keeps
their whole output row-block acc2 (BLOCK_M x D, fp32) in registers while it walks H in BLOCK_H
chunks: t = x_tile @ W1[chunk]^T + b1 -> GELU -> cast -> acc2 += t @ W2[:, chunk]^T. h never
exists in HBM. The price is register pressure: acc2 costs BLOCK_M·D/(32·num_warps) fp32
registers per thread on top of the chunk accumulator t (BLOCK_M·BLOCK_H/(32·num_warps)) and
the x tile, so D must be small — at D = 4096 a 128-row output block alone would need 2 MiB of
registers per program. That is why the fully fused form only exists for D <= 256, where the
intermediate (M·H) is also the largest part of the traffic and fusion pays most.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._common import Tuner
from kernels.linear_gelu.triton_matmul import dot_needs_f32, gelu_erf, gelu_tanh, matmul_bias_act
from kernels.linear_gelu.triton_matmul_tma import matmul_bias_act_tma

MAX_FUSED_D = 256


class FusedConfig(NamedTuple):
    block_m: int
    block_h: int
    num_warps: int
    num_stages: int


FUSED_CONFIGS: tuple[FusedConfig, ...] = (
    FusedConfig(64, 64, 4, 3), FusedConfig(128, 64, 8, 3), FusedConfig(64, 128, 4, 3),
    FusedConfig(128, 32, 8, 4), FusedConfig(64, 32, 4, 4),
)

_tuner = Tuner("mlp_fused", ("BLOCK_M", "BLOCK_H", "num_warps", "num_stages"),
               configs=FUSED_CONFIGS,
               values={"BLOCK_M": (16, 32, 64, 128), "BLOCK_H": (16, 32, 64, 128),
                       "num_warps": (2, 4, 8), "num_stages": range(1, 6)})


@triton.jit
def _mlp_fused(x_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, y_ptr, M, H, D,
               s_xm, s_w1h, s_w2d, s_ym,
               ACT: tl.constexpr, DOT_F32: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    rh = tl.arange(0, BLOCK_H)
    m_ok = rm < M
    d_ok = rd < D
    r64 = rm.to(tl.int64)
    # read BLOCK_M x D of x (once per program)
    x = tl.load(x_ptr + r64[:, None] * s_xm + rd[None, :], mask=m_ok[:, None] & d_ok[None, :],
                other=0.0)
    if DOT_F32:
        x = x.to(tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hh = h0 + rh
        h_ok = hh < H
        # read BLOCK_H x D of W1 as its transpose [D, BLOCK_H] (L2-resident across programs)
        w1t = tl.load(w1_ptr + hh[None, :].to(tl.int64) * s_w1h + rd[:, None],
                      mask=d_ok[:, None] & h_ok[None, :], other=0.0)
        # read BLOCK_H of b1
        b1 = tl.load(b1_ptr + hh, mask=h_ok, other=0.0).to(tl.float32)
        if DOT_F32:
            w1t = w1t.to(tl.float32)
        t = tl.dot(x, w1t) + b1[None, :]  # [BLOCK_M, BLOCK_H] fp32, stays on chip
        if ACT == 1:
            t = gelu_erf(t)
        else:
            t = gelu_tanh(t)
        # padded H columns are GELU(0 + 0) = 0 and meet zero rows of W2^T below
        g = t.to(x_ptr.dtype.element_ty)
        # read D x BLOCK_H of W2 as its transpose [BLOCK_H, D]
        w2t = tl.load(w2_ptr + rd[None, :].to(tl.int64) * s_w2d + hh[:, None],
                      mask=h_ok[:, None] & d_ok[None, :], other=0.0)
        if DOT_F32:
            g = g.to(tl.float32)
            w2t = w2t.to(tl.float32)
        acc = tl.dot(g, w2t, acc)
    # read D of b2 ; write BLOCK_M x D of y
    acc += tl.load(b2_ptr + rd, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + r64[:, None] * s_ym + rd[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & d_ok[None, :])


def _check(x, w1, b1, w2, b2):
    M, D = x.shape
    H = w1.shape[0]
    if w1.shape != (H, D) or b1.shape != (H,) or w2.shape != (D, H) or b2.shape != (D,):
        raise ValueError(f"mlp expects x (M, D), W1 (H, D), b1 (H,), W2 (D, H), b2 (D,); got "
                         f"{[tuple(t.shape) for t in (x, w1, b1, w2, b2)]}")
    return M, D, H


def mlp_two_kernels(x, w1, b1, w2, b2, act: str = "gelu", out=None, tma: bool = False):
    """Fused up-proj + GELU kernel, then the down-proj + bias kernel; returns y (M, D).
    `tma`: both are the persistent TMA matmul (kernels/linear_gelu/triton_matmul_tma.py)."""
    _check(x, w1, b1, w2, b2)
    mm = matmul_bias_act_tma if tma else matmul_bias_act
    h = mm(x, w1, b1, act=act)  # write M x H of h
    return mm(h, w2, b2, act="none", out=out)  # read M x H of h


def launch_fused(x, w1, b1, w2, b2, y, act: str, cfg: FusedConfig) -> None:
    M, D = x.shape
    H = w1.shape[0]
    _mlp_fused[(triton.cdiv(M, cfg.block_m),)](
        x, w1, b1, w2, b2, y, M, H, D, x.stride(0), w1.stride(0), w2.stride(0), y.stride(0),
        ACT=1 if act == "gelu" else 2, DOT_F32=dot_needs_f32(x.dtype), BLOCK_M=cfg.block_m,
        BLOCK_D=max(16, triton.next_power_of_2(D)), BLOCK_H=cfg.block_h,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def mlp_fused(x, w1, b1, w2, b2, act: str = "gelu", out=None,
              config: FusedConfig | None = None) -> torch.Tensor:
    """One-kernel MLP for D <= MAX_FUSED_D; returns y (M, D). `config` forces a FusedConfig."""
    M, D, H = _check(x, w1, b1, w2, b2)
    if D > MAX_FUSED_D:
        raise ValueError(f"the fully fused MLP keeps a BLOCK_M x D accumulator in registers: "
                         f"D <= {MAX_FUSED_D}, got {D}")
    if act not in ("gelu", "gelu_tanh"):
        raise ValueError(f"act must be gelu or gelu_tanh, got {act!r}")
    x, w1, w2 = x.contiguous(), w1.contiguous(), w2.contiguous()
    y = torch.empty_like(x) if out is None else out
    if M == 0:
        return y
    if config is None:
        config = _tuner.pick((M, D, H, x.dtype, act), FUSED_CONFIGS,
                             lambda c: launch_fused(x, w1, b1, w2, b2, y, act, c))
    launch_fused(x, w1, b1, w2, b2, y, act, config)
    return y
