"""C = act(A @ W^T + bias) on Hopper's tensor memory accelerator: a persistent Triton matmul
whose operand tiles arrive through TMA (tensor descriptors) instead of pointer loads.

    A: (M, K)    W: (N, K) (nn.Linear layout)    bias: (N,)    C: (M, N)

Why a second matmul: on an H200 the pointer-load kernel (triton_matmul.py) ran at 0.85x
torch.compile at M=8192 K=4096 N=14336, and ncu said why: 255 registers per thread, occupancy
12 %, top stall `dispatch_stall`, tensor pipe 65 % (cuBLAS: 168 registers, tensor pipe 94 %).
With pointer loads every thread computes and holds the addresses of its share of each
128x64 / 256x64 tile and issues the cp.async copies itself. A tensor descriptor moves that to
the TMA unit: one thread issues a bulk copy of the whole tile, no address registers, and the
tile lands in shared memory already in the swizzled layout wgmma reads.

Persistent: NUM_SMS programs each walk the output tiles tile_id = pid, pid + NUM_SMS, ... in the
grouped ("L2-swizzled") order of triton_matmul.py, so the next tile's loads are issued while
the current tile's epilogue runs (tl.range(flatten=True) pipelines across the tile boundary)
and no wave of programs ends ragged. The epilogue (bias, GELU, rounding) runs on the fp32
accumulator and stores through a descriptor too, in EPI_SPLIT column halves so the staging
buffer is half a tile of shared memory.

TMA's rules: the row strides of A, W and C must be multiples of 16 bytes (K and N multiples
of 8 in fp16/bf16) and the bases 16-byte aligned; `tma_unsupported` says why not otherwise.
Tiles past the edge of a matrix are read as zeros and clipped on store, so the K loop and the
edges need no masks.

Traffic per tile: read BLOCK_M x K of A and BLOCK_N x K of W (mostly L2 hits thanks to the
grouping); write BLOCK_M x BLOCK_N of C once.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._common import TensorDescriptor, Tuner, interpreted, sm_count
from kernels.linear_gelu.triton_matmul import (ACTIVATIONS, _epilogue, check_operands,
                                               dot_needs_f32)


TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


class TmaConfig(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    epi_split: int  # the epilogue stores the tile in this many column slices (1 or 2)

    def label(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k} g{self.group_m} "
                f"w{self.num_warps} s{self.num_stages} e{self.epi_split}")


# Hopper candidates (shared memory per stage: (BLOCK_M + BLOCK_N) x BLOCK_K x 2 bytes; the
# whole budget, stages + epilogue staging, stays under sm_90's 227 KiB: checked by
# `python -m kernels.layernorm.fused_aot_check --only matmul_tma`: none spills).
CONFIGS: tuple[TmaConfig, ...] = (
    TmaConfig(128, 256, 64, 8, 8, 3, 2),
    TmaConfig(128, 128, 64, 8, 8, 4, 1),
    TmaConfig(128, 256, 64, 8, 8, 4, 2),
    TmaConfig(256, 128, 64, 8, 8, 3, 2),
    TmaConfig(128, 128, 64, 8, 8, 3, 1),
    TmaConfig(128, 128, 128, 8, 8, 3, 1),
)
# In the CPU interpreter: small tiles and few "SMs", so a small problem still spans several
# tiles per program, a ragged group and a split epilogue.
INTERPRETER_CONFIG = TmaConfig(32, 32, 32, 2, 4, 1, 2)
INTERPRETER_SMS = 3

_tuner = Tuner("matmul_tma",
               ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages",
                "EPI_SPLIT"),
               configs=(*CONFIGS, INTERPRETER_CONFIG),
               values={"BLOCK_M": (64, 128, 256), "BLOCK_N": (64, 128, 256),
                       "BLOCK_K": (32, 64, 128), "GROUP_M": (1, 4, 8, 16),
                       "num_warps": (4, 8), "num_stages": range(1, 6), "EPI_SPLIT": (1, 2)})


@triton.jit
def _tile_of(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of a tile in grouped order: GROUP_M row-tiles share a column panel."""
    per_group = GROUP_M * num_pid_n
    first_m = (tile_id // per_group) * GROUP_M
    group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % per_group) % group_size
    pid_n = (tile_id % per_group) // group_size
    return pid_m, pid_n


@triton.jit
def _matmul_tma(a_desc, w_desc, c_desc, bias_ptr, M, N, K,
                HAS_BIAS: tl.constexpr, ACT: tl.constexpr, DOT_F32: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, EPI_SPLIT: tl.constexpr, NUM_SMS: tl.constexpr,
                C_DTYPE: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    SLICE_N: tl.constexpr = BLOCK_N // EPI_SPLIT
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = _tile_of(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            # read BLOCK_M x BLOCK_K of A and BLOCK_N x BLOCK_K of W (TMA; L2 mostly)
            a = a_desc.load([off_m, ki * BLOCK_K])
            w = w_desc.load([off_n, ki * BLOCK_K])
            if DOT_F32:  # interpreter only: its tl.dot multiplies bf16 bit patterns as integers
                a = a.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(a, w.T, acc)
        # epilogue on the fp32 accumulator: + bias, activation, one rounding to C's dtype
        if EPI_SPLIT == 2:
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, SLICE_N)), (0, 2, 1))
            acc0, acc1 = tl.split(halves)
            rn0 = off_n + tl.arange(0, SLICE_N)
            # write BLOCK_M x BLOCK_N/2 of C, twice
            c_desc.store([off_m, off_n],
                         _epilogue(acc0, bias_ptr, rn0, N, HAS_BIAS, ACT).to(C_DTYPE))
            c_desc.store([off_m, off_n + SLICE_N],
                         _epilogue(acc1, bias_ptr, rn0 + SLICE_N, N, HAS_BIAS, ACT)
                         .to(C_DTYPE))
        else:
            rn = off_n + tl.arange(0, BLOCK_N)
            # write BLOCK_M x BLOCK_N of C
            c_desc.store([off_m, off_n],
                         _epilogue(acc, bias_ptr, rn, N, HAS_BIAS, ACT).to(C_DTYPE))


def tma_unsupported(dims: dict[str, int], dtype: torch.dtype) -> str | None:
    """Why the TMA matmul cannot take operands whose row lengths are `dims` (name -> elements),
    or None when it can."""
    if TensorDescriptor is None:
        return "tensor descriptors need triton >= 3.4"
    size = torch.empty((), dtype=dtype).element_size()
    bad = [f"{n}={v}" for n, v in dims.items() if (v * size) % 16]
    if bad:
        return (f"TMA needs row strides that are multiples of 16 bytes: {', '.join(bad)} "
                f"(want multiples of {16 // size} in {str(dtype).removeprefix('torch.')})")
    return None


def tma_refusal(a: torch.Tensor, w: torch.Tensor, c: torch.Tensor) -> str | None:
    """Why this kernel cannot take these operands as they are (descriptors need contiguous rows
    whose strides are multiples of 16 bytes, 16-byte aligned bases), or None."""
    why = tma_unsupported({"K": a.shape[1], "N": w.shape[0]}, a.dtype)
    if why:
        return why
    if a.dtype not in TL_DTYPES:
        return f"dtype must be one of float16, bfloat16, float32, got {a.dtype}"
    bad = [n for n, t in (("a", a), ("w", w), ("out", c)) if not t.is_contiguous()]
    if bad:
        return f"{', '.join(bad)} not contiguous"
    odd = [n for n, t in (("a", a), ("w", w), ("out", c)) if t.data_ptr() % 16]
    return f"{', '.join(odd)} not 16-byte aligned" if odd else None


def configs() -> tuple[TmaConfig, ...]:
    """Candidates for the Tuner (the first is the untimed default)."""
    return (INTERPRETER_CONFIG,) if interpreted() else CONFIGS


def launch(a, w, bias, c, act: str, cfg: TmaConfig, sms: int) -> None:
    """One launch: c (M, N) = act(a (M, K) @ w (N, K)^T + bias (N,) or no bias)."""
    M, K = a.shape
    N = w.shape[0]
    if cfg.block_n % cfg.epi_split:
        raise ValueError(f"BLOCK_N={cfg.block_n} is not divisible by EPI_SPLIT={cfg.epi_split}")
    a_desc = TensorDescriptor.from_tensor(a, [cfg.block_m, cfg.block_k])
    w_desc = TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k])
    c_desc = TensorDescriptor.from_tensor(c, [cfg.block_m, cfg.block_n // cfg.epi_split])
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    grid = (min(sms, tiles),)
    _matmul_tma[grid](
        a_desc, w_desc, c_desc, bias if bias is not None else a, M, N, K,
        HAS_BIAS=bias is not None, ACT=ACTIVATIONS[act], DOT_F32=dot_needs_f32(a.dtype),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        EPI_SPLIT=cfg.epi_split, NUM_SMS=grid[0], C_DTYPE=TL_DTYPES[c.dtype],
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def matmul_bias_act_tma(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                        act: str = "none", out: torch.Tensor | None = None,
                        config: TmaConfig | None = None) -> torch.Tensor:
    """act(a @ w^T + bias) through TMA: a (M, K), w (N, K), bias (N,) or None -> (M, N) in a's
    dtype. `config` forces a TmaConfig instead of the tuned one."""
    M, N, K = check_operands(a, w, bias, act)
    a, w = a.contiguous(), w.contiguous()
    c = torch.empty((M, N), device=a.device, dtype=a.dtype) if out is None else out
    why = tma_refusal(a, w, c)
    if why:
        raise ValueError(why)
    if M == 0 or N == 0:
        return c
    if K == 0:
        raise ValueError("K must be positive")
    sms = sm_count(a.device, INTERPRETER_SMS)
    if config is None:
        key = (M, N, K, a.dtype, act, bias is not None)
        config = _tuner.pick(key, configs(), lambda cfg: launch(a, w, bias, c, act, cfg, sms))
    launch(a, w, bias, c, act, config, sms)
    return c
