"""C = act(A @ W^T + bias) in Triton, with the bias add and the activation applied to the fp32
accumulator tile before the store (the epilogue), so the pre-activation never reaches HBM.

    A: (M, K)    W: (N, K) (nn.Linear layout)    bias: (N,)    C: (M, N)
    act: "none" | "gelu" (exact, erf) | "gelu_tanh" (tanh approximation)

Tiling follows what makes Triton competitive with cuBLAS on Hopper: BLOCK_M x BLOCK_N output
tiles (128 x 128..256), BLOCK_K = 64, 8 warps, 3-4 software-pipelined stages, fp32
accumulation with tl.dot, and a grouped ("L2-swizzled") program order: GROUP_M row-tiles share
each column panel of W while it is hot in L2. The Tuner times a handful of configurations per
problem shape. The loads are plain masked pointer loads (no TMA/tensor descriptors), so the
same source runs on Triton 3.6 (GPU box) and 3.9 (CI interpreter).

`matmul_bias_act` is also the entry to the persistent TMA form (triton_matmul_tma.py): its
Tuner has a field TMA (0: this file's kernel, any strides; 1: the TMA kernel, where K, N and
the operands allow it). Both forms' configs are candidates; where TMA can run the Tuner times
only the TMA ones (`timed`), elsewhere the pointer ones, and a YAML `config: {TMA: 0}` times
the pointer ones anyway. On an H200 the TMA form measured 1.02-1.21x torch.compile at the
Llama MLP shapes where this kernel measured 0.83-0.98x (experiments/linear_gelu.yaml, run
...-a535), and it was faster in every mlp.yaml case too (run ...-a62e).

Traffic per tile: read BLOCK_M x K of A and BLOCK_N x K of W (mostly L2 hits thanks to the
grouping); write BLOCK_M x BLOCK_N of C once.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._common import Rule, Tuner, interpreter_bf16, sm_count

ACTIVATIONS = {"none": 0, "gelu": 1, "gelu_tanh": 2}


class MatmulConfig(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    epi_split: int = 1  # TMA form: the epilogue stores the tile in this many column slices
    tma: int = 0  # 0: this file's pointer kernel; 1: triton_matmul_tma's persistent TMA kernel

    def label(self) -> str:
        form = f" e{self.epi_split} tma" if self.tma else ""
        return (f"{self.block_m}x{self.block_n}x{self.block_k} g{self.group_m} "
                f"w{self.num_warps} s{self.num_stages}{form}")


# Hopper-oriented candidates; the first is the untimed default (interpreter).
CONFIGS: tuple[MatmulConfig, ...] = (
    MatmulConfig(128, 256, 64, 8, 8, 3),
    MatmulConfig(128, 128, 64, 8, 8, 4),
    MatmulConfig(128, 256, 64, 8, 8, 4),
    MatmulConfig(256, 128, 64, 8, 8, 3),
)

_tuner = Tuner("matmul_bias_act",
               ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages",
                "EPI_SPLIT", "TMA"),
               configs=CONFIGS,
               values={"BLOCK_M": (16, 32, 64, 128, 256), "BLOCK_N": (16, 32, 64, 128, 256),
                       "BLOCK_K": (16, 32, 64, 128), "GROUP_M": (1, 4, 8, 16),
                       "num_warps": (2, 4, 8), "num_stages": range(1, 6), "EPI_SPLIT": (1, 2),
                       "TMA": (0, 1)},
               rules=[Rule(("EPI_SPLIT", "TMA"), lambda e, t: e == 1 or t == 1,
                           "EPI_SPLIT 2 needs TMA=1 (the pointer kernel stores whole tiles)"),
                      Rule(("BLOCK_N", "EPI_SPLIT"), lambda n, e: n % e == 0,
                           "BLOCK_N % EPI_SPLIT == 0")])


@triton.jit
def gelu_erf(x):
    """Exact GELU of an fp32 tensor: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))."""
    return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))


@triton.jit
def gelu_tanh(x):
    """tanh-approximate GELU of an fp32 tensor, written as x * sigmoid(2u):
    0.5 x (1 + tanh u) = x / (1 + exp(-2u)),  u = sqrt(2/pi) (x + 0.044715 x^3).
    exp(-2u) overflows to inf for very negative x, giving -0 (the right limit)."""
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return x / (1.0 + tl.exp(-2.0 * u))


@triton.jit
def _epilogue(acc, bias_ptr, rn, N, HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    """bias + activation on an fp32 accumulator slice whose columns are rn."""
    if HAS_BIAS:
        # read the slice's columns of bias
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:
        acc = gelu_erf(acc)
    elif ACT == 2:
        acc = gelu_tanh(acc)
    return acc


@triton.jit
def _matmul_bias_act(a_ptr, w_ptr, bias_ptr, c_ptr, M, N, K,
                     s_am, s_ak, s_wn, s_wk, s_cm, s_cn,
                     HAS_BIAS: tl.constexpr, ACT: tl.constexpr, EVEN_K: tl.constexpr,
                     DOT_F32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # grouped program order: consecutive programs walk GROUP_M row-tiles of one column panel
    pid = tl.program_id(0)
    n_pid_m = tl.cdiv(M, BLOCK_M)
    n_pid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * n_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_size = tl.minimum(n_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_size
    pid_n = (pid % per_group) // group_size

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # rows/cols past the edge are wrapped back in bounds for the loads (their results are
    # never stored), so the K loop needs no M/N masks
    am = (rm % M).to(tl.int64)
    wn = (rn % N).to(tl.int64)
    a_ptrs = a_ptr + am[:, None] * s_am + rk[None, :] * s_ak   # [BLOCK_M, BLOCK_K] of A
    w_ptrs = w_ptr + rk[:, None] * s_wk + wn[None, :] * s_wn   # [BLOCK_K, BLOCK_N] of W^T
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            # read BLOCK_M x BLOCK_K of A and BLOCK_K x BLOCK_N of W (L2 mostly)
            a = tl.load(a_ptrs)
            w = tl.load(w_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            w = tl.load(w_ptrs, mask=rk[:, None] < k_left, other=0.0)
        if DOT_F32:  # interpreter only: its tl.dot multiplies bf16 bit patterns as integers
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, w, acc)
        a_ptrs += BLOCK_K * s_ak
        w_ptrs += BLOCK_K * s_wk
    # epilogue on the fp32 accumulator: + bias, activation, one rounding to the output dtype
    acc = _epilogue(acc, bias_ptr, rn, N, HAS_BIAS, ACT)
    c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * s_cm + rn[None, :] * s_cn
    # write BLOCK_M x BLOCK_N of C
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm < M)[:, None] & (rn < N)[None, :])


dot_needs_f32 = interpreter_bf16  # bf16 tiles are upcast for tl.dot in the interpreter only


def launch(a, w, bias, c, act: str, cfg: MatmulConfig) -> None:
    """One launch: c (M, N) = act(a (M, K) @ w (N, K)^T + bias (N,) or no bias); cfg.tma=1
    launches the persistent TMA kernel (its operands must pass triton_matmul_tma.tma_refusal)."""
    if cfg.tma:
        from kernels.linear_gelu import triton_matmul_tma as tmt  # it imports this module

        why = tmt.tma_refusal(a, w, c)
        if why:
            raise ValueError(f"config {cfg.label()}: TMA=1, but {why}")
        return tmt.launch(a, w, bias, c, act, tmt.TmaConfig(*cfg[:7]),
                          sm_count(a.device, tmt.INTERPRETER_SMS))
    M, K = a.shape
    N = w.shape[0]
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)
    _matmul_bias_act[grid](
        a, w, bias if bias is not None else a, c, M, N, K,
        a.stride(0), a.stride(1), w.stride(0), w.stride(1), c.stride(0), c.stride(1),
        HAS_BIAS=bias is not None, ACT=ACTIVATIONS[act], EVEN_K=(K % cfg.block_k == 0),
        DOT_F32=dot_needs_f32(a.dtype),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def check_operands(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                   act: str) -> tuple[int, int, int]:
    """(M, N, K) of c = act(a @ w^T + bias), or ValueError naming what does not fit."""
    if act not in ACTIVATIONS:
        raise ValueError(f"act must be one of {', '.join(ACTIVATIONS)}, got {act!r}")
    if a.dim() != 2 or w.dim() != 2 or a.shape[1] != w.shape[1]:
        raise ValueError(f"expected a (M, K) and w (N, K), got {tuple(a.shape)} and "
                         f"{tuple(w.shape)}")
    if a.dtype != w.dtype:
        raise ValueError(f"a and w must share a dtype, got {a.dtype} and {w.dtype}")
    M, K = a.shape
    N = w.shape[0]
    if bias is not None and bias.shape != (N,):
        raise ValueError(f"bias must have shape ({N},), got {tuple(bias.shape)}")
    return M, N, K


def matmul_bias_act(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                    act: str = "none", out: torch.Tensor | None = None,
                    config: MatmulConfig | None = None) -> torch.Tensor:
    """act(a @ w^T + bias): a (M, K), w (N, K), bias (N,) or None -> (M, N) in a's dtype.

    The Tuner picks per shape among the TMA kernel's configs where the operands allow TMA
    (triton_matmul_tma.tma_refusal), else among the pointer ones. `config` forces a
    MatmulConfig instead (benchmarks, tests; `tma=1` the TMA kernel).
    """
    M, N, K = check_operands(a, w, bias, act)
    c = torch.empty((M, N), device=a.device, dtype=a.dtype) if out is None else out
    if M == 0 or N == 0:
        return c
    if K == 0:
        raise ValueError("K must be positive")
    if config is None:
        key = (M, N, K, a.dtype, act, bias is not None)
        config = _tuner.pick(key, candidates(a, w, c),
                             lambda cfg: launch(a, w, bias, c, act, cfg),
                             timed=lambda cfg: cfg.tma == 1)
    launch(a, w, bias, c, act, config)
    return c


def candidates(a: torch.Tensor, w: torch.Tensor, c: torch.Tensor) -> list[MatmulConfig]:
    """The Tuner's candidates for these operands: the pointer configs, then the TMA kernel's
    where triton_matmul_tma.tma_refusal allows (the first is the interpreter's untimed choice)."""
    from kernels.linear_gelu import triton_matmul_tma as tmt

    cands = list(CONFIGS)
    if tmt.tma_refusal(a, w, c) is None:
        cands += [MatmulConfig(*t, tma=1) for t in tmt.configs()]
    return cands
