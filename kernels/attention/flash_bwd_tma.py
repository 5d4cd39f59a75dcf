"""FlashAttention-2 backward with Hopper's tensor memory accelerator: flash_bwd.py's dK/dV and
dQ kernels (P recomputed from the LSE, no N x N matrix, no atomics) with every Q, K, V, dO
tile moved by TMA descriptors and dK, dV, dQ stored through them. The delta preprocess is
flash_bwd's.

Why: in an sm_90 build the pointer-load dK/dV kernel needs 234 registers per thread at D=128
with its first candidate, and the tiles an H200 measured fastest ((64, 64, 4, 2),
(64, 128, 8, 3)) hit 255 and spill (python -m kernels.attention.aot_check --d 128). Every thread computes and holds the addresses of its
share of the streamed Q and dO tiles; with descriptors the TMA unit does, and those registers
go to the accumulators.

Like flash_fwd_tma.py, the descriptors are (B*H*N, D) row views, so N must be a multiple of
every tile the kernels walk (a box past a head's end would read, or write, the next head);
`configs_for` keeps only such tiles.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._common import TensorDescriptor, interpreted
from kernels.attention.flash_bwd import (DKDV_CONFIGS, DQ_CONFIGS, INTERPRETER_DKDV,
                                         INTERPRETER_DQ, SMALL_D_DKDV, SMALL_D_DQ, bwd_tuners,
                                         preprocess)
from kernels.attention.flash_fwd import LOG2E, _cast, _mma, _query_tile, interp_bf16_flag


_dkdv_tuner, _dq_tuner = bwd_tuners("attention.flash_bwd_tma")


@triton.jit
def _dkdv_tiles_tma(dk, dv, k, v, desc_q, desc_do, lse_base, delta_base, head_row, offs_n,
                    lo, hi, qk_scale, BLOCK_M1: tl.constexpr, CAUSAL_MASK: tl.constexpr,
                    INTERP_BF16: tl.constexpr):
    """Accumulate query tiles [lo, hi) of one head into dk, dv (BLOCK_N1 x D)."""
    offs_m0 = tl.arange(0, BLOCK_M1)
    for start_m in range(lo, hi, BLOCK_M1):
        rows = start_m + offs_m0
        # read BLOCK_M1 x D of Q and of dO (TMA), 2 x BLOCK_M1 floats
        q = desc_q.load([head_row + start_m, 0])
        do = desc_do.load([head_row + start_m, 0])
        lse = tl.load(lse_base + rows)
        delta = tl.load(delta_base + rows)
        qkt = _mma(k, q.T, None, INTERP_BF16)                      # (BLOCK_N1, BLOCK_M1)
        pt = tl.exp2(qkt * qk_scale - lse[None, :])
        if CAUSAL_MASK:
            pt = tl.where(rows[None, :] >= offs_n[:, None], pt, 0.0)
        dv = _mma(_cast(pt, do.dtype, INTERP_BF16), do, dv, INTERP_BF16)
        dpt = _mma(v, do.T, None, INTERP_BF16)                     # (BLOCK_N1, BLOCK_M1)
        dst = pt * (dpt - delta[None, :])
        dk = _mma(_cast(dst, q.dtype, INTERP_BF16), q, dk, INTERP_BF16)
    return dk, dv


@triton.jit
def _bwd_dkdv_tma_kernel(desc_q, desc_k, desc_v, desc_do, LSE, DELTA, desc_dk, desc_dv, n_ctx,
                         qk_scale, sm_scale, HEAD_DIM: tl.constexpr, BLOCK_M1: tl.constexpr,
                         BLOCK_N1: tl.constexpr, CAUSAL: tl.constexpr,
                         INTERP_BF16: tl.constexpr):
    """desc_*: (B*H*N, D) row views (boxes of BLOCK_M1 rows for q, do; BLOCK_N1 for k, v, dk,
    dv); LSE (base 2), DELTA: (B*H, N) fp32. n_ctx % BLOCK_N1 == 0."""
    bh = tl.program_id(1)
    head_row = bh * n_ctx
    start_n = tl.program_id(0) * BLOCK_N1
    offs_n = start_n + tl.arange(0, BLOCK_N1)
    # read BLOCK_N1 x D of K and of V (TMA)
    k = desc_k.load([head_row + start_n, 0])
    v = desc_v.load([head_row + start_n, 0])
    dk = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
    lse_base = LSE + bh.to(tl.int64) * n_ctx
    delta_base = DELTA + bh.to(tl.int64) * n_ctx
    if CAUSAL:
        # diagonal band: query rows [start_n, start_n + BLOCK_N1), masked
        dk, dv = _dkdv_tiles_tma(dk, dv, k, v, desc_q, desc_do, lse_base, delta_base,
                                 head_row, offs_n, start_n, start_n + BLOCK_N1, qk_scale,
                                 BLOCK_M1, True, INTERP_BF16)
        lo = start_n + BLOCK_N1
    else:
        lo = 0
    # query tiles below the band (or all of them): no mask
    dk, dv = _dkdv_tiles_tma(dk, dv, k, v, desc_q, desc_do, lse_base, delta_base, head_row,
                             offs_n, lo, n_ctx, qk_scale, BLOCK_M1, False, INTERP_BF16)
    # write BLOCK_N1 x D of dK and of dV (TMA)
    # (dK, dV in the inputs' dtype: k's)
    desc_dk.store([head_row + start_n, 0], _cast(dk * sm_scale, k.dtype, INTERP_BF16))
    desc_dv.store([head_row + start_n, 0], _cast(dv, k.dtype, INTERP_BF16))


@triton.jit
def _dq_tiles_tma(dq, q, do, lse, delta, desc_k, desc_v, head_row, offs_m, lo, hi, qk_scale,
                  BLOCK_N2: tl.constexpr, CAUSAL_MASK: tl.constexpr, INTERP_BF16: tl.constexpr):
    """Accumulate key tiles [lo, hi) of one head into dq (BLOCK_M2 x D)."""
    offs_n0 = tl.arange(0, BLOCK_N2)
    for start_n in range(lo, hi, BLOCK_N2):
        # read BLOCK_N2 x D of K and of V (TMA)
        k = desc_k.load([head_row + start_n, 0])
        v = desc_v.load([head_row + start_n, 0])
        qk = _mma(q, k.T, None, INTERP_BF16)                        # (BLOCK_M2, BLOCK_N2)
        p = tl.exp2(qk * qk_scale - lse[:, None])
        if CAUSAL_MASK:
            p = tl.where(offs_m[:, None] >= (start_n + offs_n0)[None, :], p, 0.0)
        dp = _mma(do, v.T, None, INTERP_BF16)
        ds = p * (dp - delta[:, None])
        dq = _mma(_cast(ds, k.dtype, INTERP_BF16), k, dq, INTERP_BF16)
    return dq


@triton.jit
def _bwd_dq_tma_kernel(desc_q, desc_k, desc_v, desc_do, LSE, DELTA, desc_dq, n_ctx, qk_scale,
                       sm_scale, HEAD_DIM: tl.constexpr, BLOCK_M2: tl.constexpr,
                       BLOCK_N2: tl.constexpr, CAUSAL: tl.constexpr, INTERP_BF16: tl.constexpr):
    """desc_*: (B*H*N, D) row views (boxes of BLOCK_M2 rows for q, do, dq; BLOCK_N2 for k, v);
    LSE (base 2), DELTA: (B*H, N) fp32. n_ctx % BLOCK_M2 == 0."""
    pid_m = _query_tile(n_ctx // BLOCK_M2, CAUSAL)
    bh = tl.program_id(1)
    head_row = bh * n_ctx
    start_m = pid_m * BLOCK_M2
    offs_m = start_m + tl.arange(0, BLOCK_M2)
    # read BLOCK_M2 x D of Q and of dO (TMA), 2 x BLOCK_M2 floats
    q = desc_q.load([head_row + start_m, 0])
    do = desc_do.load([head_row + start_m, 0])
    lse = tl.load(LSE + bh.to(tl.int64) * n_ctx + offs_m)
    delta = tl.load(DELTA + bh.to(tl.int64) * n_ctx + offs_m)
    dq = tl.zeros([BLOCK_M2, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:
        # key tiles left of the diagonal band: no mask
        dq = _dq_tiles_tma(dq, q, do, lse, delta, desc_k, desc_v, head_row, offs_m, 0, start_m,
                           qk_scale, BLOCK_N2, False, INTERP_BF16)
        dq = _dq_tiles_tma(dq, q, do, lse, delta, desc_k, desc_v, head_row, offs_m, start_m,
                           start_m + BLOCK_M2, qk_scale, BLOCK_N2, True, INTERP_BF16)
    else:
        dq = _dq_tiles_tma(dq, q, do, lse, delta, desc_k, desc_v, head_row, offs_m, 0, n_ctx,
                           qk_scale, BLOCK_N2, False, INTERP_BF16)
    # write BLOCK_M2 x D of dQ (TMA)
    desc_dq.store([head_row + start_m, 0], _cast(dq * sm_scale, q.dtype, INTERP_BF16))


def configs_for(D: int, N: int) -> tuple[list, list]:
    """(dK/dV, dQ) launch configurations for head dim D whose tiles divide N."""
    if interpreted():
        dkdv, dq = [INTERPRETER_DKDV], [INTERPRETER_DQ]
    else:
        dkdv, dq = DKDV_CONFIGS.get(D, SMALL_D_DKDV), DQ_CONFIGS.get(D, SMALL_D_DQ)
    return ([c for c in dkdv if N % c[1] == 0], [c for c in dq if N % c[0] == 0])


def unsupported(N: int, D: int) -> str | None:
    """Why the TMA backward cannot run this shape (None when it can)."""
    if TensorDescriptor is None:
        return "tensor descriptors need triton >= 3.4"
    dkdv, dq = configs_for(D, N)
    if not dkdv or not dq:
        return f"TMA boxes are whole tiles of a head: no backward tile divides N={N}"
    return None


def tma_launchers(q, k, v, do, lse, delta, dq, dk, dv, causal: bool):
    """(launch_dkdv, launch_dq): the TMA dK/dV and dQ kernels of contiguous (B, H, N, D)
    tensors, each taking (BLOCK_M, BLOCK_N, num_warps, num_stages); a tile that does not divide
    N is a ValueError. flash_bwd.flash_backward uses them for its TMA=1 candidates."""
    B, H, N, D = q.shape
    sm_scale = 1.0 / math.sqrt(D)
    qk_scale = sm_scale * LOG2E
    interp_bf16 = interp_bf16_flag(q.dtype)
    rows = {name: t.view(B * H * N, D) for name, t in
            (("q", q), ("k", k), ("v", v), ("do", do), ("dq", dq), ("dk", dk), ("dv", dv))}

    def desc(name: str, box: int):
        return TensorDescriptor.from_tensor(rows[name], [box, D])

    def launch_dkdv(cfg):
        bm, bn, warps, stages = cfg
        if bn % bm or N % bn:
            raise ValueError(f"dK/dV config {tuple(cfg)}: BLOCK_N1 must divide N={N} and be a "
                             f"multiple of BLOCK_M1")
        _bwd_dkdv_tma_kernel[(N // bn, B * H)](
            desc("q", bm), desc("k", bn), desc("v", bn), desc("do", bm), lse, delta,
            desc("dk", bn), desc("dv", bn), N, qk_scale, sm_scale, HEAD_DIM=D, BLOCK_M1=bm,
            BLOCK_N1=bn, CAUSAL=causal, INTERP_BF16=interp_bf16, num_warps=warps,
            num_stages=stages)

    def launch_dq(cfg):
        bm, bn, warps, stages = cfg
        if bm % bn or N % bm:
            raise ValueError(f"dQ config {tuple(cfg)}: BLOCK_M2 must divide N={N} and be a "
                             f"multiple of BLOCK_N2")
        _bwd_dq_tma_kernel[(N // bm, B * H)](
            desc("q", bm), desc("k", bn), desc("v", bn), desc("do", bm), lse, delta,
            desc("dq", bm), N, qk_scale, sm_scale, HEAD_DIM=D, BLOCK_M2=bm, BLOCK_N2=bn,
            CAUSAL=causal, INTERP_BF16=interp_bf16, num_warps=warps, num_stages=stages)

    return launch_dkdv, launch_dq


def flash_backward_tma(q, k, v, o, lse, do, causal: bool,
                       dkdv_config: tuple[int, int, int, int] | None = None,
                       dq_config: tuple[int, int, int, int] | None = None):
    """(dq, dk, dv), each (B, H, N, D) in q's dtype, as flash_backward, with TMA loads and
    stores only; N must be a multiple of the tiles (`unsupported` says why not)."""
    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do))
    B, H, N, D = q.shape
    why = unsupported(N, D)
    if why:
        raise ValueError(why)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    delta = torch.empty((B, H, N), device=q.device, dtype=torch.float32)
    preprocess(o, do, delta)
    launch_dkdv, launch_dq = tma_launchers(q, k, v, do, lse, delta, dq, dk, dv, causal)
    key = (B, H, N, D, causal, q.dtype)
    dkdv_cands, dq_cands = configs_for(D, N)
    if dkdv_config is None:
        dkdv_config = _dkdv_tuner.pick(("dkdv_tma", *key), dkdv_cands, launch_dkdv)
    if dq_config is None:
        dq_config = _dq_tuner.pick(("dq_tma", *key), dq_cands, launch_dq)
    launch_dkdv(dkdv_config)
    launch_dq(dq_config)
    return dq, dk, dv
