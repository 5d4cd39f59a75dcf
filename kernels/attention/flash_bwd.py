"""FlashAttention-2-style backward pass in Triton: recompute P from Q, K and the saved LSE
instead of reading an N x N matrix.

Three kernels:
  1. preprocess   delta_i = rowsum(dO_i * O_i)                    (B*H, N) fp32
                  traffic: read N x D of O and of dO, write N floats
  2. dK/dV        one program per BLOCK_N1 key rows; loops over query tiles of BLOCK_M1:
                      P^T = exp2(K Q^T * qk_scale - LSE)        (recomputed)
                      dV += P^T dO ; dP^T = V dO^T ; dS^T = P^T * (dP^T - delta)
                      dK += dS^T Q            (times 1/sqrt(D) once at the end)
                  traffic: read BLOCK_N1 x D of K, V once; per query tile read BLOCK_M1 x D
                  of Q and dO plus 2 x BLOCK_M1 floats; write BLOCK_N1 x D of dK, dV
  3. dQ           one program per BLOCK_M2 query rows; loops over key tiles of BLOCK_N2:
                      P = exp2(Q K^T * qk_scale - LSE) ; dP = dO V^T ; dS = P * (dP - delta)
                      dQ += dS K              (times 1/sqrt(D) at the end)
                  traffic: read BLOCK_M2 x D of Q, dO once; per key tile BLOCK_N2 x D of K, V;
                  write BLOCK_M2 x D of dQ
Each of dK, dV, dQ is owned by one program: no atomics, deterministic. (On Hopper at D=128 the
dK/dV Tuner may pick flash_bwd_gluon.py's one-pass kernel instead, `TMA: 4`: dQ by TMA
reductions, five matmuls instead of seven; see flash_backward.)

Causal: tiles above the diagonal are skipped; the diagonal band (BLOCK_N1 query rows for dK/dV,
BLOCK_M2 key rows for dQ) runs with the mask, everything else without. Ragged N: one masked
tail tile. Invariants: BLOCK_N1 % BLOCK_M1 == 0 and BLOCK_M2 % BLOCK_N2 == 0.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from harness import tuning
from kernels._common import Rule, Tuner, interpreted
from kernels.attention.flash_fwd import (FIELDS, LOG2E, _cast, _mma, _query_tile,
                                         interp_bf16_flag, uses_tma)

# (BLOCK_M1, BLOCK_N1, num_warps, num_stages) for dK/dV; (BLOCK_M2, BLOCK_N2, ...) for dQ.
# D=128: the forced-config grids on an H200 at B=4 N=4096, fp16 (experiments/tune/
# flash_bwd_{dkdv,dq}_grid.yaml) measured dK/dV (64, 64, 4, 2) at 3.71 ms and (64, 128, 8, 3) at
# 3.92 ms against 4.47 ms for the old pick (32, 64, 4, 3), and dQ (128, 64, 8, 3) at 4.17 ms
# against 4.35 ms: they join the candidates, and the Tuner times them per shape. The 64-row
# dK/dV tiles spill (on the H200's triton 3.6, (64, 64, 4, 2) by 22 registers; in the local
# triton 3.9 sm_90 build both, python -m kernels.attention.aot_check), so the first entry, the
# one `aot_check --quick` builds and the one a near-tie goes to, stays the spill-free
# (32, 64, 4, 3).
DKDV_CONFIGS = {
    128: [(32, 64, 4, 3), (64, 64, 4, 2), (64, 128, 8, 3), (32, 128, 8, 2), (32, 64, 8, 3),
          (16, 128, 8, 3)],
    64: [(64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 3)],
}
DQ_CONFIGS = {
    128: [(128, 64, 8, 3), (128, 32, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (64, 32, 4, 3)],
    64: [(128, 32, 4, 3), (128, 64, 8, 3), (128, 32, 8, 3), (64, 64, 4, 3)],
}
SMALL_D_DKDV = [(32, 64, 4, 3), (32, 32, 4, 2)]
SMALL_D_DQ = [(64, 32, 4, 3), (32, 32, 4, 2)]
INTERPRETER_DKDV = (16, 32, 4, 1)
INTERPRETER_DQ = (32, 16, 4, 1)
PRE_BLOCK = 64

_VALUES = {"BLOCK_M": (16, 32, 64, 128), "BLOCK_N": (16, 32, 64, 128), "num_warps": (2, 4, 8),
           "num_stages": range(1, 6)}


def bwd_tuners(prefix: str, tma_field: bool = False) -> tuple[Tuner, Tuner]:
    """The dK/dV and dQ Tuners (`<prefix>.dkdv`, `<prefix>.dq`): fields BLOCK_M/BLOCK_N stand
    for BLOCK_M1/BLOCK_N1 (dK/dV) and BLOCK_M2/BLOCK_N2 (dQ); with `tma_field`, a fifth field
    TMA picks the kernel form (0: pointer loads, this file; 1: flash_bwd_tma.py; for dK/dV
    also 4: flash_bwd_gluon.py's one-pass kernel, dQ included)."""
    fields = (*FIELDS, "TMA") if tma_field else FIELDS
    values = {**_VALUES, "TMA": (0, 1)} if tma_field else _VALUES
    dkdv = Tuner(f"{prefix}.dkdv", fields,
                 configs=[*DKDV_CONFIGS[128], *DKDV_CONFIGS[64], *SMALL_D_DKDV, INTERPRETER_DKDV],
                 values={**values, "TMA": (0, 1, 4)} if tma_field else values,
                 rules=[Rule(("BLOCK_M", "BLOCK_N"), lambda m, n: n % m == 0,
                             "BLOCK_N % BLOCK_M == 0")])
    dq = Tuner(f"{prefix}.dq", fields,
               configs=[*DQ_CONFIGS[128], *DQ_CONFIGS[64], *SMALL_D_DQ, INTERPRETER_DQ],
               values=values,
               rules=[Rule(("BLOCK_M", "BLOCK_N"), lambda m, n: m % n == 0,
                           "BLOCK_M % BLOCK_N == 0")])
    return dkdv, dq


# triton_flash's: pointer and TMA kernels; where N allows TMA the Tuners time only the TMA
# configs (flash_fwd.uses_tma), ragged N and a YAML `{TMA: 0}` the pointer ones. On an H200 the
# TMA backward measured 1.02-1.14x the pointer one at every shape of
# experiments/flash_bwd_tma.yaml (run ...-ca53); with the Tuners timing both forms, the
# backward ran at 0.99-1.05x the speed of the TMA form alone (geo-mean 1.02x, run ...-ee8f),
# where they picked TMA for both kernels at every D=128 shape: twice the candidates to compile
# and time, for a difference within the two impls' pick noise.
# TMA 4 (dK/dV Tuner only) is flash_bwd_gluon.py's one-pass kernel (FA3's form: dK, dV and dQ
# in one kernel, dQ added by TMA reductions; Hopper, D 64 or 128): where it is a candidate, the
# dQ Tuner picks first and every dK/dV candidate is timed as a whole backward (see
# flash_backward). On an H100 over experiments/flash_bwd.yaml (runs ...-5408 -> ...-b953 in one
# lease, then ...-4983): triton_flash 1.08-1.34x faster at D=128 (N=1024 causal stays on the
# two-kernel form), 0.97-1.07x cuDNN at D=128 N >= 4096 where it was 0.76-0.88x. At D=64
# (...-7341 -> ...-783a, one H100 call): 1.02-1.19x faster at N >= 4096, where it is picked.
_dkdv_tuner, _dq_tuner = bwd_tuners("attention.flash_bwd", tma_field=True)


@triton.jit
def _bwd_preprocess(O, DO, DELTA, ACC, SYNC, n_ctx, ring, HEAD_DIM: tl.constexpr,
                    BLOCK: tl.constexpr, ZERO: tl.constexpr):
    """DELTA[bh, i] = sum_d O[bh, i, d] * DO[bh, i, d]; O, DO (B*H, N, D); DELTA (B*H, N).
    ZERO: also zero the one-pass Gluon backward's dQ ring ACC (ring, N, D) fp32 and its
    counters SYNC (1 + 2 * B*H int32; flash_bwd_gluon.py), so that they cost no kernel."""
    bh = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = offs_m < n_ctx
    ptrs = bh * n_ctx * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    # read BLOCK x D of O and of dO
    o = tl.load(O + ptrs, mask=ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + ptrs, mask=ok[:, None], other=0.0).to(tl.float32)
    # write BLOCK floats
    tl.store(DELTA + bh * n_ctx + offs_m, tl.sum(o * do, axis=1), mask=ok)
    if ZERO:
        if bh < ring:
            # write BLOCK x D floats of zeros (the ring's slot bh)
            tl.store(ACC + ptrs, tl.zeros([BLOCK, HEAD_DIM], dtype=tl.float32),
                     mask=ok[:, None])
        if tl.program_id(0) == 0:
            # write 2 (3 for head 0) ints: slot bh's turn, head bh's programs done (the ticket)
            n_bh = tl.num_programs(1)
            zero = tl.zeros([1], dtype=tl.int32)
            one = tl.arange(0, 1)
            tl.store(SYNC + 1 + bh + one, zero)
            tl.store(SYNC + 1 + n_bh + bh + one, zero)
            if bh == 0:
                tl.store(SYNC + one, zero)


def preprocess(o, do, delta, acc=None, sync=None) -> None:
    """delta = rowsum(o * do) (B, H, N) fp32 for o, do (B, H, N, D); with `acc` (ring * N, D)
    fp32 and `sync` (1 + 2 * B*H) int32, zero them in the same kernel."""
    B, H, N, D = o.shape
    zero = acc is not None
    _bwd_preprocess[(triton.cdiv(N, PRE_BLOCK), B * H)](
        o, do, delta, acc if zero else delta, sync if zero else delta, N,
        acc.shape[0] // N if zero else 0, HEAD_DIM=D, BLOCK=PRE_BLOCK, ZERO=zero, num_warps=4)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, offs_n, offs_d, n_ctx,
                lo, hi, qk_scale, BLOCK_M1: tl.constexpr, HEAD_DIM: tl.constexpr,
                CAUSAL_MASK: tl.constexpr, BOUNDS: tl.constexpr, INTERP_BF16: tl.constexpr):
    """Accumulate the contributions of query tiles [lo, hi) into dk, dv (BLOCK_N1 x D)."""
    offs_m0 = tl.arange(0, BLOCK_M1)
    for start_m in range(lo, hi, BLOCK_M1):
        rows = start_m + offs_m0
        qt_ptrs = q_base + rows[None, :] * HEAD_DIM + offs_d[:, None]
        do_ptrs = do_base + rows[:, None] * HEAD_DIM + offs_d[None, :]
        if BOUNDS:
            ok = rows < n_ctx
            # read BLOCK_M1 x D of Q (as Q^T) and of dO, 2 x BLOCK_M1 floats
            qt = tl.load(qt_ptrs, mask=ok[None, :], other=0.0)
            do = tl.load(do_ptrs, mask=ok[:, None], other=0.0)
            lse = tl.load(lse_base + rows, mask=ok, other=0.0)
            delta = tl.load(delta_base + rows, mask=ok, other=0.0)
        else:
            # read BLOCK_M1 x D of Q (as Q^T) and of dO, 2 x BLOCK_M1 floats
            qt = tl.load(qt_ptrs)
            do = tl.load(do_ptrs)
            lse = tl.load(lse_base + rows)
            delta = tl.load(delta_base + rows)
        qkt = _mma(k, qt, None, INTERP_BF16)                       # (BLOCK_N1, BLOCK_M1)
        pt = tl.exp2(qkt * qk_scale - lse[None, :])
        if CAUSAL_MASK or BOUNDS:
            keep = rows[None, :] < n_ctx
            if CAUSAL_MASK:
                keep = keep & (rows[None, :] >= offs_n[:, None])
            pt = tl.where(keep, pt, 0.0)
        dv = _mma(_cast(pt, do.dtype, INTERP_BF16), do, dv, INTERP_BF16)
        dpt = _mma(v, tl.trans(do), None, INTERP_BF16)             # (BLOCK_N1, BLOCK_M1)
        dst = pt * (dpt - delta[None, :])
        dk = _mma(_cast(dst, qt.dtype, INTERP_BF16), tl.trans(qt), dk, INTERP_BF16)
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, n_ctx, qk_scale, sm_scale,
                     HEAD_DIM: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
                     CAUSAL: tl.constexpr, INTERP_BF16: tl.constexpr):
    """Q, K, V, DO, DK, DV: (B*H, N, D); LSE (base 2), DELTA: (B*H, N) fp32."""
    bh = tl.program_id(1).to(tl.int64)
    head = bh * n_ctx * HEAD_DIM
    start_n = tl.program_id(0) * BLOCK_N1
    offs_n = start_n + tl.arange(0, BLOCK_N1)
    offs_d = tl.arange(0, HEAD_DIM)
    key_ok = offs_n < n_ctx
    kv_ptrs = head + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    # read BLOCK_N1 x D of K and of V
    k = tl.load(K + kv_ptrs, mask=key_ok[:, None], other=0.0)
    v = tl.load(V + kv_ptrs, mask=key_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
    q_base, do_base = Q + head, DO + head
    lse_base, delta_base = LSE + bh * n_ctx, DELTA + bh * n_ctx
    n_full = (n_ctx // BLOCK_M1) * BLOCK_M1
    if CAUSAL:
        # diagonal band: query rows [start_n, start_n + BLOCK_N1), masked
        band_end = tl.minimum(start_n + BLOCK_N1, n_ctx)
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, offs_n,
                             offs_d, n_ctx, start_n, band_end, qk_scale, BLOCK_M1, HEAD_DIM,
                             True, True, INTERP_BF16)
        lo = start_n + BLOCK_N1
    else:
        lo = 0
    # whole query tiles below the band (or all of them): no mask
    dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, offs_n, offs_d,
                         n_ctx, lo, n_full, qk_scale, BLOCK_M1, HEAD_DIM, False, False, INTERP_BF16)
    # ragged tail tile
    dk, dv = _dkdv_tiles(dk, dv, k, v, q_base, do_base, lse_base, delta_base, offs_n, offs_d,
                         n_ctx, tl.maximum(lo, n_full), n_ctx, qk_scale, BLOCK_M1, HEAD_DIM,
                         False, True, INTERP_BF16)
    # write BLOCK_N1 x D of dK and of dV
    tl.store(DK + kv_ptrs, _cast(dk * sm_scale, DK.dtype.element_ty, INTERP_BF16), mask=key_ok[:, None])
    tl.store(DV + kv_ptrs, _cast(dv, DV.dtype.element_ty, INTERP_BF16), mask=key_ok[:, None])


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, k_base, v_base, offs_m, offs_d, n_ctx, lo, hi, qk_scale,
              BLOCK_N2: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL_MASK: tl.constexpr,
              BOUNDS: tl.constexpr, INTERP_BF16: tl.constexpr):
    """Accumulate the contributions of key tiles [lo, hi) into dq (BLOCK_M2 x D)."""
    offs_n0 = tl.arange(0, BLOCK_N2)
    for start_n in range(lo, hi, BLOCK_N2):
        cols = start_n + offs_n0
        t_ptrs = cols[None, :] * HEAD_DIM + offs_d[:, None]
        if BOUNDS:
            # read BLOCK_N2 x D of K and of V (as K^T, V^T)
            kt = tl.load(k_base + t_ptrs, mask=cols[None, :] < n_ctx, other=0.0)
            vt = tl.load(v_base + t_ptrs, mask=cols[None, :] < n_ctx, other=0.0)
        else:
            # read BLOCK_N2 x D of K and of V (as K^T, V^T)
            kt = tl.load(k_base + t_ptrs)
            vt = tl.load(v_base + t_ptrs)
        qk = _mma(q, kt, None, INTERP_BF16)                        # (BLOCK_M2, BLOCK_N2)
        p = tl.exp2(qk * qk_scale - lse[:, None])
        if CAUSAL_MASK or BOUNDS:
            keep = cols[None, :] < n_ctx
            if CAUSAL_MASK:
                keep = keep & (offs_m[:, None] >= cols[None, :])
            p = tl.where(keep, p, 0.0)
        dp = _mma(do, vt, None, INTERP_BF16)
        ds = p * (dp - delta[:, None])
        dq = _mma(_cast(ds, kt.dtype, INTERP_BF16), tl.trans(kt), dq, INTERP_BF16)
    return dq


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, n_ctx, qk_scale, sm_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr,
                   CAUSAL: tl.constexpr, INTERP_BF16: tl.constexpr):
    """Q, K, V, DO, DQ: (B*H, N, D); LSE (base 2), DELTA: (B*H, N) fp32."""
    pid_m = _query_tile(tl.cdiv(n_ctx, BLOCK_M2), CAUSAL)
    bh = tl.program_id(1).to(tl.int64)
    head = bh * n_ctx * HEAD_DIM
    start_m = pid_m * BLOCK_M2
    offs_m = start_m + tl.arange(0, BLOCK_M2)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_ctx
    ptrs = head + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    # read BLOCK_M2 x D of Q and of dO, 2 x BLOCK_M2 floats
    q = tl.load(Q + ptrs, mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + ptrs, mask=row_ok[:, None], other=0.0)
    lse = tl.load(LSE + bh * n_ctx + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh * n_ctx + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M2, HEAD_DIM], dtype=tl.float32)
    k_base, v_base = K + head, V + head
    if CAUSAL:
        # key tiles left of the diagonal band: no mask
        dq = _dq_tiles(dq, q, do, lse, delta, k_base, v_base, offs_m, offs_d, n_ctx, 0,
                       start_m, qk_scale, BLOCK_N2, HEAD_DIM, False, False, INTERP_BF16)
        hi = tl.minimum(start_m + BLOCK_M2, n_ctx)
        dq = _dq_tiles(dq, q, do, lse, delta, k_base, v_base, offs_m, offs_d, n_ctx, start_m,
                       hi, qk_scale, BLOCK_N2, HEAD_DIM, True, True, INTERP_BF16)
    else:
        n_full = (n_ctx // BLOCK_N2) * BLOCK_N2
        dq = _dq_tiles(dq, q, do, lse, delta, k_base, v_base, offs_m, offs_d, n_ctx, 0,
                       n_full, qk_scale, BLOCK_N2, HEAD_DIM, False, False, INTERP_BF16)
        dq = _dq_tiles(dq, q, do, lse, delta, k_base, v_base, offs_m, offs_d, n_ctx, n_full,
                       n_ctx, qk_scale, BLOCK_N2, HEAD_DIM, False, True, INTERP_BF16)
    # write BLOCK_M2 x D of dQ
    tl.store(DQ + ptrs, _cast(dq * sm_scale, DQ.dtype.element_ty, INTERP_BF16), mask=row_ok[:, None])


def _configs(table: dict, small: list, interp, D: int) -> list:
    if interpreted():
        return [interp]
    return table.get(D, small)


def flash_backward(q, k, v, o, lse, do, causal: bool,
                   dkdv_config: tuple[int, ...] | None = None,
                   dq_config: tuple[int, ...] | None = None):
    """(dq, dk, dv), each (B, H, N, D) in q's dtype.

    q, k, v, o, do: (B, H, N, D); lse: (B, H, N) fp32, base 2, from flash_forward.
    Configs (BLOCK_M, BLOCK_N, num_warps, num_stages[, TMA]) force a launch configuration
    (TMA 0, the default: pointer loads; 1: flash_bwd_tma.py's kernel; dK/dV only, 4: the
    one-pass Gluon kernel of flash_bwd_gluon.py, which computes dQ too, so no dQ kernel runs);
    otherwise the Tuners pick each kernel's per (B, H, N, D, causal, dtype) among the TMA and
    Gluon configs where N (and the GPU) allow them, else among the pointer ones.
    """
    from kernels.attention import flash_bwd_gluon, flash_bwd_tma  # they import this module

    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do))
    B, H, N, D = q.shape
    sm_scale = 1.0 / math.sqrt(D)
    qk_scale = sm_scale * LOG2E
    interp_bf16 = interp_bf16_flag(q.dtype)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    # the Tuners' timing launches read delta before the preprocess below writes it: what they
    # compute is overwritten, and no kernel's time depends on the values
    delta = torch.empty((B, H, N), device=q.device, dtype=torch.float32)
    tma_ok = flash_bwd_tma.unsupported(N, D) is None
    tma = (flash_bwd_tma.tma_launchers(q, k, v, do, lse, delta, dq, dk, dv, causal)
           if tma_ok else None)
    no_gluon = flash_bwd_gluon.unsupported(N, D, q.device)
    gluon = (None if no_gluon else
             flash_bwd_gluon.gluon_launcher(q, k, v, do, lse, delta, dq, dk, dv, causal))

    def need_tma(cfg):
        if tma is None:
            raise ValueError(f"config {tuple(cfg)}: TMA=1, but {flash_bwd_tma.unsupported(N, D)}")
        return tma

    def need_gluon(cfg):
        if gluon is None:
            raise ValueError(f"config {tuple(cfg)}: TMA=4, but {no_gluon}")
        return gluon

    def launch_dkdv(cfg):
        bm, bn, warps, stages, form = cfg
        if form == 4:  # the one-pass plan launches its own kernels (timed_dkdv, below)
            raise ValueError(f"dK/dV config {tuple(cfg)}: TMA=4 is not a dK/dV kernel of the "
                             f"two-kernel plan")
        if form:
            return need_tma(cfg)[0]((bm, bn, warps, stages))
        _bwd_dkdv_kernel[(triton.cdiv(N, bn), B * H)](
            q, k, v, do, lse, delta, dk, dv, N, qk_scale, sm_scale, HEAD_DIM=D, BLOCK_M1=bm,
            BLOCK_N1=bn, CAUSAL=causal, INTERP_BF16=interp_bf16, num_warps=warps, num_stages=stages)

    def launch_dq(cfg):
        bm, bn, warps, stages, form = cfg
        if form:
            return need_tma(cfg)[1]((bm, bn, warps, stages))
        _bwd_dq_kernel[(triton.cdiv(N, bm), B * H)](
            q, k, v, do, lse, delta, dq, N, qk_scale, sm_scale, HEAD_DIM=D, BLOCK_M2=bm,
            BLOCK_N2=bn, CAUSAL=causal, INTERP_BF16=interp_bf16, num_warps=warps, num_stages=stages)

    key = (B, H, N, D, causal, q.dtype)
    tma_dkdv, tma_dq = flash_bwd_tma.configs_for(D, N) if tma_ok else ([], [])
    dkdv_config, dq_config = (None if c is None else tuple(c) if len(c) == 5 else (*c, 0)
                              for c in (dkdv_config, dq_config))
    if dq_config is not None and dq_config[4] == 4:
        raise ValueError(f"dQ config {dq_config}: TMA=4 (the one-pass Gluon backward) is a "
                         f"dK/dV form only: it computes dQ itself")
    # a dQ config forced (argument or YAML) is a dQ kernel to measure: no one-pass plan then,
    # and a one-pass plan forced beside it is a contradiction, not a silent choice
    dq_forced = dq_config is not None or bool(tuning.forced(_dq_tuner.name))
    one_pass_forced = ((dkdv_config is not None and dkdv_config[4] == 4)
                       or (tuning.forced(_dkdv_tuner.name) or {}).get("TMA") == 4)
    if dq_forced and one_pass_forced:
        raise ValueError("dK/dV TMA=4 (the one-pass Gluon backward) runs no dQ kernel, but a "
                         "dQ config is forced too: force one or the other")
    one_pass = ([(*c, 4) for c in flash_bwd_gluon.configs_for(D, N)]
                if gluon and not dq_forced else [])

    def pick_dq():
        cands = [(*c, 0) for c in _configs(DQ_CONFIGS, SMALL_D_DQ, INTERPRETER_DQ, D)]
        return tuple(_dq_tuner.pick(("dq", *key), cands + [(*c, 1) for c in tma_dq], launch_dq,
                                    timed=uses_tma))

    dq_unlogged = False  # picked before the plan is known: not (yet) the case's
    if dq_config is None and not one_pass_forced:
        if one_pass and dkdv_config is None:
            with tuning.unlogged():
                dq_config = pick_dq()
            dq_unlogged = True
        else:
            dq_config = pick_dq()

    def timed_dkdv(cfg):
        # where the one-pass form is a candidate every candidate is timed as a whole backward
        # but the delta kernel: a two-kernel one with the dQ kernel the dQ Tuner picked, the
        # one-pass one as it runs (its dQ casts and the last heads' copy; a memset where the
        # delta kernel zeroes its ring in a measured call). Timing the one-pass kernel without
        # its cast (a separate kernel then), small shapes went to the one-pass form where a
        # whole backward ran 1.04-1.05x slower (N=1024 causal, H100).
        if cfg[4] == 4:
            need_gluon(cfg)(cfg[:4])
            return
        launch_dkdv(cfg)
        if one_pass:
            launch_dq(dq_config)

    if dkdv_config is None:
        cands = [(*c, 0) for c in _configs(DKDV_CONFIGS, SMALL_D_DKDV, INTERPRETER_DKDV, D)]
        dkdv_config = tuple(_dkdv_tuner.pick(
            ("dkdv", *key), cands + [(*c, 1) for c in tma_dkdv] + one_pass, timed_dkdv,
            timed=uses_tma))
    if dkdv_config[4] == 4:
        launch = need_gluon(dkdv_config)  # it checks the config
        launch(dkdv_config[:4], zero_with=lambda acc, sync: preprocess(o, do, delta, acc, sync))
        return dq, dk, dv
    if dq_unlogged:  # a dQ kernel runs after all: its pick is the case's too
        dq_config = pick_dq()
    if dkdv_config[1] % dkdv_config[0] or dq_config[0] % dq_config[1]:
        raise ValueError(f"need BLOCK_N1 % BLOCK_M1 == 0 and BLOCK_M2 % BLOCK_N2 == 0, got "
                         f"dK/dV {dkdv_config}, dQ {dq_config}")
    preprocess(o, do, delta)
    launch_dkdv(dkdv_config)
    launch_dq(dq_config)
    return dq, dk, dv
