"""FlashAttention-2-style forward pass in Triton.

One program per (block of BLOCK_M query rows, batch*head). It keeps its Q tile on chip,
streams K and V through shared memory in BLOCK_N-row tiles and keeps a running max m, running
sum l and an unnormalised accumulator (online softmax), so the N x N scores never reach HBM:

    traffic per program: read BLOCK_M x D of Q, (keys visited) x D of K and of V,
                         write BLOCK_M x D of O and BLOCK_M floats of LSE.

Scores are taken in base 2: qk_scale = log2(e)/sqrt(D) is folded into one multiply and
exp2 replaces exp. LSE is saved in the same units (m + log2 l, i.e. logsumexp * log2 e) so the
backward pass recomputes P = exp2(qk * qk_scale - LSE) without the normaliser.

Causal: key tiles entirely above the diagonal are never visited. Tiles entirely below it run
without any mask; the BLOCK_M-wide band on the diagonal runs separately with the mask. Ragged N
(not a multiple of the block sizes): only the last key tile and the last query tile are masked.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._common import Rule, Tuner, interpreted, interpreter_bf16

LOG2E = 1.4426950408889634

# (BLOCK_M, BLOCK_N, num_warps, num_stages) timed per shape by the Tuner on a GPU.
# Invariant: BLOCK_M % BLOCK_N == 0 (the causal diagonal band is whole key tiles). None of these
# spills registers in an sm_90 build (python -m kernels.attention.aot_check).
FWD_CONFIGS = {
    128: [(128, 64, 8, 3), (128, 64, 8, 2), (128, 64, 8, 4), (128, 128, 8, 2), (64, 64, 4, 3),
          (64, 64, 4, 2)],
    64: [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 2), (64, 64, 4, 3)],
}
SMALL_D_CONFIGS = [(64, 32, 4, 3), (32, 32, 4, 2), (64, 64, 4, 3)]  # D = 16, 32
# In the CPU interpreter: small tiles, so a short sequence still spans several query and key
# tiles (diagonal band, unmasked tiles and a ragged tail all run in tests).
INTERPRETER_CONFIG = (32, 16, 4, 1)

FIELDS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
# The forward's Tuner has one more field, TMA: 0 is this file's kernel (pointer loads, masked
# tails, any N), 1 flash_fwd_tma.py's (Hopper TMA descriptors; N a multiple of the query tile).
# Both forms' configs are candidates; where N allows TMA the Tuner times only the TMA ones
# (`timed`), and a YAML `config: {TMA: 0}` still times the pointer ones. On an H200, with the
# Tuner timing both forms, triton_flash ran at 0.96-1.04x the speed of the TMA form alone over
# the 16 shapes of experiments/flash_tma.yaml (geo-mean 1.00x, run ...-d4bf): twice the
# candidates to compile and time for no gain. The TMA form alone measured 0.95-1.14x the
# pointer form (run ...-1554). TMA 2 is the TMA kernel with its key loops warp-specialized by
# Triton (tl.range(warp_specialize=True)); only forced (experiments/tune/flash_fwd_ws.yaml),
# never timed by default: on an H200 with triton 3.6 (run ...-tune-flash-fwd-ws-9c16, N=4096)
# the 8-warp tiles ran 0.99-1.03x the same tiles without it, none reached the Tuner's pick, and
# the 4-warp tiles failed to compile (PassManager::run failed) or, at 64x64 non-causal, wrote
# NaN (the check caught it). TMA 3 is the TMA kernel launched with its registers per thread
# capped (`maxnreg`, flash_fwd_tma.reg_cap) so that one more program fits on an SM: at
# (128, 64, 8, 2) and D=128 a triton 3.6 sm_90 build then takes 122 registers instead of 138,
# with no spill, and two 8-warp programs (96 KiB of shared memory each) share an SM instead of
# one; timed with the TMA configs where N allows (flash_fwd_tma.CAPPED_CONFIGS;
# experiments/tune/flash_fwd_regs.yaml). TMA 4 is the Gluon kernel of flash_fwd_gluon.py (FA3's
# form: a TMA producer warp, consumer warpgroups with explicit asynchronous wgmma, the softmax
# of one key tile overlapping the P V product of the previous one): BLOCK_M 128 or, at D=64,
# 192 (two or three consumer warpgroups; 192 with 128-row key tiles, the one exception to
# BLOCK_M % BLOCK_N == 0: each warpgroup masks from its own diagonal) and num_warps 4 (a
# consumer warpgroup's) fixed, num_stages the K/V ring depth; Hopper only, timed with the TMA
# configs where it runs.
FWD_FIELDS = (*FIELDS, "TMA")
# what a YAML config may force (harness variants): the values above plus tile sizes tl.dot takes
_tuner = Tuner("attention.flash_fwd", FWD_FIELDS,
               configs=[*FWD_CONFIGS[128], *FWD_CONFIGS[64], *SMALL_D_CONFIGS, INTERPRETER_CONFIG],
               values={"BLOCK_M": (16, 32, 64, 128, 192, 256), "BLOCK_N": (16, 32, 64, 128),
                       "num_warps": (2, 4, 8, 16), "num_stages": range(1, 7), "TMA": (0, 1, 2, 3, 4)},
               rules=[Rule(("BLOCK_M", "BLOCK_N"), lambda m, n: m % n == 0 or m == 192,
                           "BLOCK_M % BLOCK_N == 0 (BLOCK_M 192: the Gluon kernel, TMA 4)"),
                      Rule(("BLOCK_M", "TMA"), lambda m, t: m != 192 or t == 4,
                           "BLOCK_M 192 is the Gluon kernel's (TMA 4) only")])


@triton.jit
def _query_tile(n_mblocks, CAUSAL: tl.constexpr):
    """This program's query tile: causal grids run the heaviest tiles (most keys) first, since
    they set the kernel's tail."""
    if CAUSAL:
        return n_mblocks - 1 - tl.program_id(0)
    return tl.program_id(0)


@triton.jit
def _mma(a, b, acc, INTERP_BF16: tl.constexpr):
    """acc + a @ b (acc may be None). INTERP_BF16 is set only for bf16 in the CPU interpreter,
    whose tl.dot (triton 3.9) multiplies the raw bf16 bit patterns as integers (triton-lang/triton
    #11584; the interpreter does not support bf16 arithmetic): products of bf16 values are exact
    in fp32, so upcasting first gives the GPU's bf16 MMA with fp32 sums."""
    if INTERP_BF16:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _cast(x, dtype: tl.constexpr, INTERP_BF16: tl.constexpr):
    """x.to(dtype), rounding to nearest even. The interpreter (triton 3.9) truncates fp32 ->
    bf16 instead, so with INTERP_BF16 the rounding is done on the bits first (then the
    truncating cast is exact)."""
    if INTERP_BF16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        bits = (bits >> 16) << 16
        return bits.to(tl.float32, bitcast=True).to(dtype)
    else:
        return x.to(dtype)


@triton.jit
def _softmax_step(qk, keep, m_i, l_i, acc, qk_scale, MASKED: tl.constexpr):
    """One online-softmax step over a [BLOCK_M, BLOCK_N] score tile qk (unscaled; entries where
    `keep` is false, when MASKED, count as -inf): (p, acc rescaled to the new row max, the new
    max m, the new row sum l), all in base 2."""
    if MASKED:
        qk = tl.where(keep, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        qk = qk - m_new[:, None]
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_new[:, None]
    p = tl.exp2(qk)
    alpha = tl.exp2(m_i - m_new)
    return p, acc * alpha[:, None], m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _fwd_tiles(acc, m_i, l_i, q, k_base, v_base, offs_m, offs_d, n_ctx, lo, hi, qk_scale,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL_MASK: tl.constexpr,
               BOUNDS: tl.constexpr, INTERP_BF16: tl.constexpr):
    """Fold key tiles [lo, hi) into (acc, m_i, l_i). Masks exist only when the flags ask."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        kt_ptrs = k_base + cols[None, :] * HEAD_DIM + offs_d[:, None]
        v_ptrs = v_base + cols[:, None] * HEAD_DIM + offs_d[None, :]
        if BOUNDS:
            # read BLOCK_N x D of K (as K^T), rows past N read as 0
            kt = tl.load(kt_ptrs, mask=cols[None, :] < n_ctx, other=0.0)
        else:
            # read BLOCK_N x D of K (as K^T)
            kt = tl.load(kt_ptrs)
        qk = _mma(q, kt, None, INTERP_BF16)
        if CAUSAL_MASK or BOUNDS:
            keep = cols[None, :] < n_ctx
            if CAUSAL_MASK:
                keep = keep & (offs_m[:, None] >= cols[None, :])
            p, acc, m_new, l_i = _softmax_step(qk, keep, m_i, l_i, acc, qk_scale, True)
        else:
            p, acc, m_new, l_i = _softmax_step(qk, None, m_i, l_i, acc, qk_scale, False)
        if BOUNDS:
            # read BLOCK_N x D of V
            v = tl.load(v_ptrs, mask=cols[:, None] < n_ctx, other=0.0)
        else:
            # read BLOCK_N x D of V
            v = tl.load(v_ptrs)
        acc = _mma(_cast(p, v.dtype, INTERP_BF16), v, acc, INTERP_BF16)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _flash_fwd_kernel(Q, K, V, O, LSE, n_ctx, qk_scale,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      CAUSAL: tl.constexpr, INTERP_BF16: tl.constexpr):
    """Q, K, V, O: (B*H, N, D) contiguous; LSE: (B*H, N) fp32, base-2 log-sum-exp."""
    pid_m = _query_tile(tl.cdiv(n_ctx, BLOCK_M), CAUSAL)
    bh = tl.program_id(1).to(tl.int64)
    head = bh * n_ctx * HEAD_DIM
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_ctx
    # read BLOCK_M x D of Q
    q = tl.load(Q + head + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None],
                other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    k_base = K + head
    v_base = V + head
    if CAUSAL:
        # tiles left of the diagonal band: every key visible, all inside N
        acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, k_base, v_base, offs_m, offs_d, n_ctx,
                                   0, start_m, qk_scale, BLOCK_N, HEAD_DIM, False, False, INTERP_BF16)
        # the diagonal band: causal mask, and N bounds for the last query tile
        hi = tl.minimum(start_m + BLOCK_M, n_ctx)
        acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, k_base, v_base, offs_m, offs_d, n_ctx,
                                   start_m, hi, qk_scale, BLOCK_N, HEAD_DIM, True, True, INTERP_BF16)
    else:
        n_full = (n_ctx // BLOCK_N) * BLOCK_N
        acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, k_base, v_base, offs_m, offs_d, n_ctx,
                                   0, n_full, qk_scale, BLOCK_N, HEAD_DIM, False, False, INTERP_BF16)
        # ragged tail: at most one key tile with N bounds
        acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, k_base, v_base, offs_m, offs_d, n_ctx,
                                   n_full, n_ctx, qk_scale, BLOCK_N, HEAD_DIM, False, True,
                                   INTERP_BF16)
    o = acc / l_i[:, None]
    # write BLOCK_M floats of LSE
    tl.store(LSE + bh * n_ctx + offs_m, m_i + tl.log2(l_i), mask=row_ok)
    # write BLOCK_M x D of O
    tl.store(O + head + offs_m[:, None] * HEAD_DIM + offs_d[None, :], _cast(o, O.dtype.element_ty, INTERP_BF16),
             mask=row_ok[:, None])


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must share one (B, H, N, D) shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    D = q.shape[-1]
    if D < 16 or D & (D - 1) or D > 128:
        raise ValueError(f"head dim D must be a power of two in [16, 128], got {D}")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be float16 or bfloat16, got {q.dtype}")


def configs_for(D: int) -> list[tuple[int, int, int, int]]:
    """Launch configurations to try for head dim D (the first is the interpreter's choice)."""
    if interpreted():
        return [INTERPRETER_CONFIG]
    return FWD_CONFIGS.get(D, SMALL_D_CONFIGS)


def uses_tma(cfg: tuple) -> bool:
    """A (..., TMA) candidate of the folded Tuners is a TMA form they time by default where N
    allows it: the plain TMA kernel (1), the register-capped one (3, the forward's only) or a
    Gluon one (4: the forward's, and the backward's one-pass dK/dV form)."""
    return cfg[-1] in (1, 3, 4)


def interp_bf16_flag(dtype: torch.dtype) -> bool:
    """The INTERP_BF16 kernel flag: bf16 in the CPU interpreter (see _mma, _cast)."""
    return interpreter_bf16(dtype)


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  config: tuple[int, ...] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """o (B, H, N, D) in q's dtype and lse (B, H, N) fp32 in base 2, for q, k, v (B, H, N, D).

    `config` = (BLOCK_M, BLOCK_N, num_warps, num_stages[, TMA]) forces one launch
    configuration (TMA 0, the default: pointer loads; 1: the TMA kernel; 2: the TMA kernel
    with warp-specialized key loops; 3: the TMA kernel with its registers capped; 4: the
    Gluon FA3-form kernel, Hopper only);
    otherwise the Tuner
    picks per (B, H, N, D, causal, dtype) among the TMA configs where N allows them, else among
    the pointer ones.
    """
    from kernels.attention import flash_fwd_gluon, flash_fwd_tma  # they import this module

    check_inputs(q, k, v)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, H, N, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((B, H, N), device=q.device, dtype=torch.float32)
    qk_scale = LOG2E / math.sqrt(D)
    interp_bf16 = interp_bf16_flag(q.dtype)
    tma_ok = flash_fwd_tma.unsupported(N, D) is None
    launch_tma = flash_fwd_tma.tma_launcher(q, k, v, o, lse, causal) if tma_ok else None
    no_gluon = flash_fwd_gluon.unsupported(N, D, q.device)
    launch_gluon = None if no_gluon else flash_fwd_gluon.gluon_launcher(q, k, v, o, lse, causal)

    def launch(cfg):
        bm, bn, warps, stages, tma = cfg
        if tma == 4:
            if launch_gluon is None:
                raise ValueError(f"config {tuple(cfg)}: TMA=4, but {no_gluon}")
            return launch_gluon((bm, bn, warps, stages))
        if tma:
            if launch_tma is None:
                raise ValueError(f"config {tuple(cfg)}: TMA={tma}, but "
                                 f"{flash_fwd_tma.unsupported(N, D)}")
            return launch_tma((bm, bn, warps, stages), ws=tma == 2,
                              maxnreg=flash_fwd_tma.reg_cap(D, cfg) if tma == 3 else None)
        grid = (triton.cdiv(N, bm), B * H)
        _flash_fwd_kernel[grid](q, k, v, o, lse, N, qk_scale, HEAD_DIM=D, BLOCK_M=bm,
                                BLOCK_N=bn, CAUSAL=causal, INTERP_BF16=interp_bf16, num_warps=warps,
                                num_stages=stages)

    if config is None:
        cands = [(*c, 0) for c in configs_for(D)]
        if tma_ok:
            cands += [(*c, 1) for c in flash_fwd_tma.configs_for(D, N)]
            cands += [(*c, 3) for c in flash_fwd_tma.capped_configs_for(D, N)]
        if launch_gluon is not None:
            cands += [(*c, 4) for c in flash_fwd_gluon.configs_for(D, N)]
        config = _tuner.pick(("fwd", B, H, N, D, causal, q.dtype), cands, launch,
                             timed=uses_tma)
    elif len(config) == 4:
        config = (*config, 0)
    if config[0] % config[1] and config[4] != 4:  # the Gluon kernel checks its own tiles
        raise ValueError(f"BLOCK_M must be a multiple of BLOCK_N, got config {config}")
    launch(config)
    return o, lse
