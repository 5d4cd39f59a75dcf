"""Fused, but not flash: one Triton kernel for the whole attention forward that still puts the
N x N scores through HBM.

One program per (block of BLOCK_M query rows, batch*head), two sweeps over the keys:
  sweep 1: S = Q K^T * scale, written to an fp32 scratch row block, while a running max m and
           sum l are kept (so no third sweep is needed for the normaliser);
  sweep 2: S read back, P = exp(S - m) / l, O += P V.

    traffic per program: read BLOCK_M x D of Q, 2 x (keys) x D of K and V over both sweeps,
                         write and read back BLOCK_M x (keys) fp32 scores, write BLOCK_M x D of O
    scratch: (B*H, N, N) fp32 -- the O(N^2) memory that FlashAttention removes.

Compared with `naive` it saves launches and the separate scale/mask/softmax round trips; it does
not save the quadratic traffic or memory. Forward only: its backward would be naive's autograd.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._common import Tuner, interpreted
from kernels.attention.flash_fwd import LOG2E, _cast, _mma, check_inputs, interp_bf16_flag

# (BLOCK_M, BLOCK_N, num_warps, num_stages)
CONFIGS = [(64, 64, 4, 2), (128, 64, 8, 2), (64, 128, 4, 2)]
INTERPRETER_CONFIG = (32, 16, 4, 1)

_tuner = Tuner("attention.fused_mha", ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"),
               configs=[*CONFIGS, INTERPRETER_CONFIG],
               values={"BLOCK_M": (16, 32, 64, 128), "BLOCK_N": (16, 32, 64, 128),
                       "num_warps": (2, 4, 8), "num_stages": range(1, 5)})


@triton.jit
def _fused_mha_kernel(Q, K, V, O, S, n_ctx, qk_scale, HEAD_DIM: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                      INTERP_BF16: tl.constexpr):
    """Q, K, V, O: (B*H, N, D) contiguous; S: (B*H, N, N) fp32 scratch (base-2 scores)."""
    bh = tl.program_id(1).to(tl.int64)
    head = bh * n_ctx * HEAD_DIM
    s_head = bh * n_ctx * n_ctx
    start_m = tl.program_id(0) * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_ctx
    # read BLOCK_M x D of Q
    q = tl.load(Q + head + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None],
                other=0.0)
    if CAUSAL:
        hi = tl.minimum(start_m + BLOCK_M, n_ctx)
    else:
        hi = n_ctx
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n0
        col_ok = cols < n_ctx
        # read BLOCK_N x D of K (as K^T)
        kt = tl.load(K + head + cols[None, :] * HEAD_DIM + offs_d[:, None],
                     mask=col_ok[None, :], other=0.0)
        s = _mma(q, kt, None, INTERP_BF16) * qk_scale
        keep = col_ok[None, :]
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= cols[None, :])
        s = tl.where(keep, s, float("-inf"))
        # write BLOCK_M x BLOCK_N fp32 scores
        tl.store(S + s_head + offs_m[:, None] * n_ctx + cols[None, :], s,
                 mask=row_ok[:, None] & col_ok[None, :])
        m_new = tl.maximum(m_i, tl.max(s, 1))
        l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), 1)
        m_i = m_new
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    inv_l = 1.0 / l_i
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n0
        col_ok = cols < n_ctx
        # read BLOCK_M x BLOCK_N fp32 scores (written by sweep 1)
        s = tl.load(S + s_head + offs_m[:, None] * n_ctx + cols[None, :],
                    mask=row_ok[:, None] & col_ok[None, :], other=float("-inf"))
        p = tl.exp2(s - m_i[:, None]) * inv_l[:, None]
        # read BLOCK_N x D of V
        v = tl.load(V + head + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=col_ok[:, None],
                    other=0.0)
        acc = _mma(_cast(p, v.dtype, INTERP_BF16), v, acc, INTERP_BF16)
    # write BLOCK_M x D of O
    tl.store(O + head + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
             _cast(acc, O.dtype.element_ty, INTERP_BF16), mask=row_ok[:, None])


def fused_mha(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """Attention o (B, H, N, D) for q, k, v (B, H, N, D); allocates (B*H, N, N) fp32 scratch."""
    check_inputs(q, k, v)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, H, N, D = q.shape
    o = torch.empty_like(q)
    scratch = torch.empty((B * H, N, N), device=q.device, dtype=torch.float32)
    qk_scale = LOG2E / math.sqrt(D)
    interp_bf16 = interp_bf16_flag(q.dtype)

    def launch(cfg):
        bm, bn, warps, stages = cfg
        _fused_mha_kernel[(triton.cdiv(N, bm), B * H)](
            q, k, v, o, scratch, N, qk_scale, HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal,
            INTERP_BF16=interp_bf16, num_warps=warps, num_stages=stages)

    if config is None:
        cands = [INTERPRETER_CONFIG] if interpreted() else CONFIGS
        config = _tuner.pick((B, H, N, D, causal, q.dtype), cands, launch)
    launch(config)
    return o
