"""FlashAttention-2 forward with Hopper's tensor memory accelerator: the same algorithm as
flash_fwd.py (online softmax in base 2, LSE saved for the backward, causal tiles above the
diagonal skipped, the diagonal band masked), but Q, K and V tiles arrive through TMA tensor
descriptors and O leaves through one.

Why: on an H200 the pointer-load forward reached 0.78-0.82x cuDNN at D=128, and its ncu
verdict was latency-bound (SM 51 %, memory 45 %, DRAM 5 %; tensor pipe 51 %; top stalls barrier
and wait), not memory-bound. With pointer loads every thread computes the addresses of its
share of each K and V tile and issues the copies (186 registers per thread at (128, 64, 8, 3)
in an sm_90 build); a descriptor hands the whole tile to the TMA unit (one thread issues it,
no address registers: 138), and it lands in shared memory in the swizzled layout wgmma reads.

The descriptors are 2-D views of q, k, v, o as (B*H*N, D) rows: a head's rows are contiguous,
so a tile of BLOCK rows starting at head_row + start is one box. That needs N to be a multiple
of BLOCK_M (and so of BLOCK_N): a box past a head's end would read the next head's keys, and
an O box would overwrite its rows. `configs_for` keeps only such tiles; with none (ragged N),
the impl says it is unavailable and triton_flash (pointer loads, masked tails) is the kernel to
use.

Tried and dropped: FA3's overlap of the softmax with the next key tile's Q K^T, written by hand
(the loop peeled so that tile j+1's scores are issued before tile j's exponentials, one more
score tile live). Built for sm_90 with triton 3.6 (the GPU box's) and 3.9, the PTX waits for
that dot at once (`wgmma.commit_group` then `wgmma.wait_group 0` before the first `ex2`): Triton
keeps a wgmma in flight across other work only for a loop-carried accumulator chain (here the P
V dot, which already overlaps the next tile's K load and Q K^T issue), so the peeled form only
added registers (138 -> 174 at (128, 64, 8, 3), D=128, in a 3.9 build) and code. Expressing the
overlap needs explicit async MMAs and waits (Gluon's warpgroup_mma / warpgroup_mma_wait) or
Triton's warp specialization (TMA: 2 in flash_fwd.py: no gain on an H200). The Gluon form is
flash_fwd_gluon.py (TMA: 4): 1.01-1.18x cuDNN at D=128, N >= 4096 on an H200 where this kernel
was 0.73-0.89x.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._common import Rule, TensorDescriptor, Tuner, interpreted
from kernels.attention.flash import attention_function
from kernels.attention.flash_bwd_tma import flash_backward_tma
from kernels.attention.flash_fwd import (LOG2E, _cast, _mma, _query_tile, _softmax_step,
                                         check_inputs, interp_bf16_flag)


# (BLOCK_M, BLOCK_N, num_warps, num_stages); BLOCK_M % BLOCK_N == 0 (whole key tiles in the
# causal band). python -m kernels.attention.aot_check builds them for sm_90 (no spills).
TMA_CONFIGS = {
    128: [(128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 8, 4), (128, 128, 8, 3), (128, 64, 8, 2),
          (64, 64, 4, 3)],
    64: [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 4), (128, 128, 8, 2),
         (64, 64, 4, 3)],
}
SMALL_D_CONFIGS = [(64, 32, 4, 3), (64, 64, 4, 3), (32, 32, 4, 2)]  # D = 16, 32
INTERPRETER_CONFIG = (32, 16, 4, 1)  # CPU tests: several query and key tiles per head
# launched with a register cap (triton_flash's TMA: 3, `maxnreg`): {config: registers per
# thread}, each cap the one that fits one more program on an SM without a spill in a triton 3.6
# sm_90 build (registers, then shared memory, limit the programs per SM). On an H200: D=128's
# (128, 64, 8, 2) capped ran 1.15-1.37x its uncapped twin and 0.98-1.06x the uncapped picks at
# non-causal N >= 4096 (run ...-tune-flash-fwd-regs-8f2a; the Tuner takes it at N=4096 or
# N=16384 non-causal); D=64's (128, 128, 8, 2) capped 1.34-1.46x its twin and 0.95-1.06x the
# pick (...-tune-flash-fwd-regs-d64-816c). Capping (128, 64, 4, 3) at 168 (3 programs of 4 warps)
# or (64, 64, 4, 2) at 96 (5 programs) measured 0.97-1.05x the uncapped tiles: forceable
# (experiments/tune/flash_fwd_regs_d64.yaml), not timed by default.
REG_CAPS = {
    128: {(128, 64, 8, 2): 128},    # 122 registers: 2 programs of 8 warps (1 uncapped)
    64: {(128, 128, 8, 2): 128,     # 124: 2 programs of 8 warps (1 uncapped)
         (128, 64, 4, 3): 168,      # 166: 3 programs of 4 warps (2 uncapped)
         (64, 64, 4, 2): 96},       # 90: 5 programs of 4 warps (4 uncapped)
}
CAPPED_CONFIGS = {128: [(128, 64, 8, 2)], 64: [(128, 128, 8, 2)]}  # timed with the TMA configs
REG_CAP_DEFAULT = 128  # a forced TMA: 3 config the table does not name

FIELDS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
_tuner = Tuner("attention.flash_fwd_tma", FIELDS,
               configs=[*TMA_CONFIGS[128], *TMA_CONFIGS[64], *SMALL_D_CONFIGS,
                        INTERPRETER_CONFIG],
               values={"BLOCK_M": (16, 32, 64, 128, 256), "BLOCK_N": (16, 32, 64, 128),
                       "num_warps": (2, 4, 8, 16), "num_stages": range(1, 7)},
               rules=[Rule(("BLOCK_M", "BLOCK_N"), lambda m, n: m % n == 0,
                           "BLOCK_M % BLOCK_N == 0")])


@triton.jit
def _tiles_tma(acc, m_i, l_i, q, desc_k, desc_v, head_row, offs_m, lo, hi, qk_scale,
               BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, INTERP_BF16: tl.constexpr,
               WS: tl.constexpr):
    """Fold key tiles [lo, hi) of one head into (acc, m_i, l_i); every tile is whole. WS:
    Triton's automatic warp specialization of the loop (producer warps issue the TMA loads,
    consumer warps the MMAs and the softmax)."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        # read BLOCK_N x D of K (TMA), used as K^T
        k = desc_k.load([head_row + start_n, 0])
        qk = _mma(q, k.T, None, INTERP_BF16)
        if CAUSAL_MASK:
            keep = offs_m[:, None] >= (start_n + offs_n)[None, :]
            p, acc, m_new, l_i = _softmax_step(qk, keep, m_i, l_i, acc, qk_scale, True)
        else:
            p, acc, m_new, l_i = _softmax_step(qk, None, m_i, l_i, acc, qk_scale, False)
        # read BLOCK_N x D of V (TMA)
        v = desc_v.load([head_row + start_n, 0])
        acc = _mma(_cast(p, v.dtype, INTERP_BF16), v, acc, INTERP_BF16)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _flash_fwd_tma_kernel(desc_q, desc_k, desc_v, desc_o, LSE, n_ctx, qk_scale,
                          HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          CAUSAL: tl.constexpr, INTERP_BF16: tl.constexpr,
                          WS: tl.constexpr = False):
    """desc_*: (B*H*N, D) row views with BLOCK_M (q, o) or BLOCK_N (k, v) row boxes;
    LSE: (B*H, N) fp32, base-2 log-sum-exp. n_ctx % BLOCK_M == 0."""
    pid_m = _query_tile(n_ctx // BLOCK_M, CAUSAL)
    bh = tl.program_id(1)
    head_row = bh * n_ctx
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    # read BLOCK_M x D of Q (TMA)
    q = desc_q.load([head_row + start_m, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:
        # tiles left of the diagonal band: every key visible
        acc, m_i, l_i = _tiles_tma(acc, m_i, l_i, q, desc_k, desc_v, head_row, offs_m,
                                   0, start_m, qk_scale, BLOCK_N, False, INTERP_BF16, WS)
        # the diagonal band, masked
        acc, m_i, l_i = _tiles_tma(acc, m_i, l_i, q, desc_k, desc_v, head_row, offs_m,
                                   start_m, start_m + BLOCK_M, qk_scale, BLOCK_N, True,
                                   INTERP_BF16, WS)
    else:
        acc, m_i, l_i = _tiles_tma(acc, m_i, l_i, q, desc_k, desc_v, head_row, offs_m,
                                   0, n_ctx, qk_scale, BLOCK_N, False, INTERP_BF16, WS)
    o = acc / l_i[:, None]
    # write BLOCK_M floats of LSE
    tl.store(LSE + bh.to(tl.int64) * n_ctx + offs_m, m_i + tl.log2(l_i))
    # write BLOCK_M x D of O (TMA)
    desc_o.store([head_row + start_m, 0], _cast(o, q.dtype, INTERP_BF16))  # O is in q's dtype


def configs_for(D: int, N: int) -> list[tuple[int, int, int, int]]:
    """The launch configurations for head dim D whose tiles divide N (first: the default)."""
    cands = [INTERPRETER_CONFIG] if interpreted() else TMA_CONFIGS.get(D, SMALL_D_CONFIGS)
    return [c for c in cands if N % c[0] == 0]


def capped_configs_for(D: int, N: int) -> list[tuple[int, int, int, int]]:
    """The register-capped configurations for head dim D whose tiles divide N (none in the
    CPU interpreter, which has no registers to cap)."""
    if interpreted():
        return []
    return [c for c in CAPPED_CONFIGS.get(D, []) if N % c[0] == 0]


def reg_cap(D: int, config: tuple) -> int:
    """The registers per thread a TMA: 3 launch of `config` (BLOCK_M, BLOCK_N, num_warps,
    num_stages) is capped at."""
    return REG_CAPS.get(D, {}).get(tuple(config[:4]), REG_CAP_DEFAULT)


def unsupported(N: int, D: int) -> str | None:
    """Why the TMA forward cannot run this shape (None when it can)."""
    if TensorDescriptor is None:
        return "tensor descriptors need triton >= 3.4"
    if not configs_for(D, N):
        tiles = sorted({c[0] for c in ([INTERPRETER_CONFIG] if interpreted() else
                                       TMA_CONFIGS.get(D, SMALL_D_CONFIGS))})
        return (f"TMA boxes are whole query tiles of a head: N must be a multiple of "
                f"{' or '.join(map(str, tiles))}, got N={N} (triton_flash masks ragged N)")
    return None


def tma_launcher(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                 lse: torch.Tensor, causal: bool):
    """`launch(config, ws=False, maxnreg=None)`: the TMA forward of contiguous q, k, v
    (B, H, N, D) into o and lse with config (BLOCK_M, BLOCK_N, num_warps, num_stages), the key
    loops warp-specialized when `ws`, the registers per thread capped at `maxnreg`; a tile that
    does not divide N is a ValueError. flash_fwd.flash_forward uses it for its TMA=1 (plain),
    TMA=2 (ws) and TMA=3 (maxnreg 128) candidates."""
    B, H, N, D = q.shape
    qk_scale = LOG2E / math.sqrt(D)
    interp_bf16 = interp_bf16_flag(q.dtype)
    rows = [t.view(B * H * N, D) for t in (q, k, v, o)]

    def launch(cfg, ws: bool = False, maxnreg: int | None = None):
        bm, bn, warps, stages = cfg
        if bm % bn or N % bm:
            raise ValueError(f"config {tuple(cfg)}: BLOCK_M must divide N={N} and be a "
                             f"multiple of BLOCK_N")
        dq, dk, dv, do = (TensorDescriptor.from_tensor(t, [b, D])
                          for t, b in zip(rows, (bm, bn, bn, bm)))
        _flash_fwd_tma_kernel[(N // bm, B * H)](
            dq, dk, dv, do, lse, N, qk_scale, HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn,
            CAUSAL=causal, INTERP_BF16=interp_bf16, WS=ws, num_warps=warps,
            num_stages=stages, **({"maxnreg": maxnreg} if maxnreg and not interpreted() else {}))

    return launch


def flash_forward_tma(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                      config: tuple[int, int, int, int] | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """o (B, H, N, D) in q's dtype and lse (B, H, N) fp32 in base 2, as flash_forward, with
    TMA loads only; N must be a multiple of the query tile (`unsupported` says why not)."""
    check_inputs(q, k, v)
    B, H, N, D = q.shape
    why = unsupported(N, D)
    if why:
        raise ValueError(why)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = torch.empty_like(q)
    lse = torch.empty((B, H, N), device=q.device, dtype=torch.float32)
    launch = tma_launcher(q, k, v, o, lse, causal)
    if config is None:
        config = _tuner.pick(("fwd_tma", B, H, N, D, causal, q.dtype), configs_for(D, N), launch)
    launch(config)
    return o, lse


# the TMA forward and the TMA backward (kernels/attention/flash_bwd_tma.py)
FlashAttentionTMA = attention_function(flash_forward_tma, flash_backward_tma, "FlashAttentionTMA")


def flash_attention_tma(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                        causal: bool = False) -> torch.Tensor:
    """Attention o (B, H, N, D) for q, k, v (B, H, N, D) fp16/bf16 with the TMA kernels;
    differentiable."""
    return FlashAttentionTMA.apply(q, k, v, causal)
