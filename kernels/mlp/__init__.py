"""Op `mlp`: transformer MLP y = GELU(x @ W1^T + b1) @ W2^T + b2 (hidden size H).

    x: (M, D)   W1: (H, D)   b1: (H,)   W2: (D, H)   b2: (D,)   y: (M, D)

FLOPs: 4·M·D·H for the two matmuls + 2·M·H (bias add, GELU's final multiply) + M·D (bias 2);
erf/tanh not counted. Traffic (the floor, intermediate kept on chip): read M·D of x, 2·H·D of
weights, H + D of biases; write M·D of y -> bytes = (2·M·D + 2·H·D + H + D)·itemsize.

Implementations
- torch: F.linear, F.gelu, F.linear (eager): the pre-activation and h each round-trip HBM.
- torch_compile: default mode (cuBLAS matmuls, GELU in a generated pointwise kernel).
- triton: two kernels — up-proj with bias + GELU in the epilogue (the pre-activation never
  reaches HBM), then down-proj with bias; h (M x H) is written once and read once. Each is
  the persistent TMA matmul where D and H allow it, else the pointer-load one (the Tuner's TMA
  field; `config: {TMA: 0}` forces the pointer form).
- triton_tma: the same two kernels, each always the persistent TMA matmul
  (kernels/linear_gelu/triton_matmul_tma.py); needs D and H multiples of 8 in fp16/bf16.
- triton_fused: one kernel, only for D <= 256: h never leaves the chip. Fusion here trades
  registers for traffic — each program holds its BLOCK_M x D output accumulator in registers
  for the whole H loop (64 fp32 registers per thread at BLOCK_M = 64, D = 128, 4 warps) on top
  of the GELU chunk; at D = 4096 that is impossible (2 MiB at BLOCK_M = 128), and it would not pay
  anyway: at transformer sizes the matmuls are compute-bound and h's round trip is ~4 % of the
  time. See kernels/mlp/triton_mlp.py.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.registry import Op, Param
from kernels._common import compiled
from kernels.linear_gelu import APPROXIMATE, linear_params
from kernels.linear_gelu import triton_matmul, triton_matmul_tma
from kernels.mlp import triton_mlp

ACT = {"none": "gelu", "tanh": "gelu_tanh"}

op = Op(
    "mlp",
    params=[Param("M", int, help="rows (tokens)", size=True), Param("D", int, help="model width"),
            Param("H", int, help="hidden width"),
            Param("approximate", str, choices=APPROXIMATE, default="none",
                  help="GELU form: none = exact (erf), tanh = tanh approximation")],
    dtypes=("float16", "bfloat16"),
    primary="tflops",
    description="Linear -> GELU -> Linear; Triton keeps the pre-activation (or all of h) "
                "on chip",
)


@op.inputs
def make_inputs(p, dtype, device, gen):
    x = torch.randn(p.M, p.D, device=device, dtype=torch.float32, generator=gen).to(dtype)
    w1, b1 = linear_params(p.H, p.D, dtype, device, gen)
    w2, b2 = linear_params(p.D, p.H, dtype, device, gen)
    return x, w1, b1, w2, b2


@op.call_kwargs
def call_kwargs(p):
    return {"approximate": p.approximate}


def _mlp(x, w1, b1, w2, b2, approximate="none"):
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate=approximate), w2, b2)


@op.reference
def reference(x, w1, b1, w2, b2, approximate="none"):
    return _mlp(x, w1, b1, w2, b2, approximate)


@op.flops
def flops(p):
    return 4.0 * p.M * p.D * p.H + 2.0 * p.M * p.H + 1.0 * p.M * p.D


@op.bytes
def nbytes(p, itemsize):
    return (2.0 * p.M * p.D + 2.0 * p.H * p.D + p.H + p.D) * itemsize


@op.output
def output(inputs, p):
    return torch.empty_like(inputs[0])


def _fused_unavailable(p, dtype, device):
    if p.D > triton_mlp.MAX_FUSED_D:
        return (f"fully fused MLP holds a BLOCK_M x D accumulator in registers: needs "
                f"D <= {triton_mlp.MAX_FUSED_D}")
    return None


@op.impl("torch", backend="torch")
def mlp_torch(x, w1, b1, w2, b2, approximate="none"):
    """F.linear -> F.gelu -> F.linear (eager)"""
    return _mlp(x, w1, b1, w2, b2, approximate)


_compiled = {a: compiled(lambda x, w1, b1, w2, b2, a=a: _mlp(x, w1, b1, w2, b2, a))
             for a in APPROXIMATE}


@op.impl("torch_compile", backend="compile")
def mlp_compile(x, w1, b1, w2, b2, approximate="none"):
    """torch.compile of the MLP, default mode, one compile per shape"""
    return _compiled[approximate](x, w1, b1, w2, b2)


@op.impl("triton", backend="triton", accepts_out=True, expected_kernels=2,
         tuners=triton_matmul._tuner)
def mlp_triton(x, w1, b1, w2, b2, approximate="none", out=None):
    """Triton: up-proj with bias+GELU epilogue, then down-proj with bias epilogue; each matmul
    the persistent TMA form where D and H allow it, else pointer loads (TMA field)"""
    return triton_mlp.mlp_two_kernels(x, w1, b1, w2, b2, act=ACT[approximate], out=out)


def _tma_unavailable(p, dtype, device):
    # up-projection: K = D, N = H; down-projection: K = H, N = D
    return triton_matmul_tma.tma_unsupported({"D": p.D, "H": p.H}, getattr(torch, dtype))


@op.impl("triton_tma", backend="triton", accepts_out=True, expected_kernels=2,
         unavailable=_tma_unavailable, tuners=triton_matmul_tma._tuner)
def mlp_triton_tma(x, w1, b1, w2, b2, approximate="none", out=None):
    """Triton: the two matmuls of `triton`, each persistent with TMA operand loads"""
    return triton_mlp.mlp_two_kernels(x, w1, b1, w2, b2, act=ACT[approximate], out=out,
                                      tma=True)


@op.impl("triton_fused", backend="triton", accepts_out=True, expected_kernels=1,
         unavailable=_fused_unavailable, tuners=triton_mlp._tuner)
def mlp_triton_fused(x, w1, b1, w2, b2, approximate="none", out=None):
    """Triton, one kernel (D <= 256): h never leaves the chip; output row-block kept in registers"""
    return triton_mlp.mlp_fused(x, w1, b1, w2, b2, act=ACT[approximate], out=out)
