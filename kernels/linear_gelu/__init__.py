"""Op `linear_gelu`: y = GELU(x @ W^T + b), the up-projection of a transformer MLP.

    x: (M, K)    W: (N, K) (nn.Linear layout)    b: (N,)    y: (M, N)
    approximate: "none" (exact erf GELU) | "tanh" (the tanh approximation)

FLOPs: 2·M·N·K for the matmul + 2·M·N (bias add, and the final x·Phi(x) multiply); the erf/tanh
evaluation itself is not counted (special functions, as softmax does not count exp).
Traffic: read M·K of x, N·K of W, N of b; write M·N of y -> bytes = (M·K + N·K + N + M·N)·itemsize.
Eager torch writes the pre-activation and reads it back (2·M·N more); the fused Triton kernel
applies bias and GELU to the fp32 accumulator before its only store.

Implementations: torch (F.linear then F.gelu), torch_compile (by default cuBLAS for the matmul
and a generated kernel for the GELU), triton (two forms behind its Tuner's TMA field: the
persistent TMA kernel where K and N allow it, else pointer loads, kernels/linear_gelu/
triton_matmul.py; a YAML `config: {TMA: 0}` forces the pointer form), triton_tma (the TMA form
through its own Tuner, operands through Hopper's TMA: triton_matmul_tma.py; needs K and N
multiples of 8 in fp16/bf16).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.registry import Op, Param
from kernels._common import compiled
from kernels.linear_gelu import triton_matmul, triton_matmul_tma

APPROXIMATE = ("none", "tanh")
ACT = {"none": "gelu", "tanh": "gelu_tanh"}  # approximate -> triton_matmul activation

op = Op(
    "linear_gelu",
    params=[Param("M", int, help="rows (tokens)", size=True),
            Param("K", int, help="input features"),
            Param("N", int, help="output features"),
            Param("approximate", str, choices=APPROXIMATE, default="none",
                  help="GELU form: none = exact (erf), tanh = tanh approximation")],
    dtypes=("float16", "bfloat16"),
    primary="tflops",
    description="Linear + GELU with the bias and activation in the matmul epilogue",
)


def linear_params(n_out: int, n_in: int, dtype, device, gen):
    """nn.Linear-like weights: W (n_out, n_in) ~ U(-1/sqrt(n_in), 1/sqrt(n_in)), b likewise."""
    bound = n_in ** -0.5
    w = (torch.rand(n_out, n_in, device=device, dtype=torch.float32, generator=gen) * 2 - 1)
    b = (torch.rand(n_out, device=device, dtype=torch.float32, generator=gen) * 2 - 1)
    return (w * bound).to(dtype), (b * bound).to(dtype)


@op.inputs
def make_inputs(p, dtype, device, gen):
    x = torch.randn(p.M, p.K, device=device, dtype=torch.float32, generator=gen).to(dtype)
    w, b = linear_params(p.N, p.K, dtype, device, gen)
    return x, w, b


@op.call_kwargs
def call_kwargs(p):
    return {"approximate": p.approximate}


@op.reference
def reference(x, w, b, approximate="none"):
    return F.gelu(F.linear(x, w, b), approximate=approximate)


@op.flops
def flops(p):
    return 2.0 * p.M * p.N * p.K + 2.0 * p.M * p.N


@op.bytes
def nbytes(p, itemsize):
    return (p.M * p.K + p.N * p.K + p.N + p.M * p.N) * float(itemsize)


@op.output
def output(inputs, p):
    x, w, _ = inputs
    return torch.empty((x.shape[0], w.shape[0]), device=x.device, dtype=x.dtype)


@op.impl("torch", backend="torch")
def linear_gelu_torch(x, w, b, approximate="none"):
    """F.linear (cuBLAS, bias in its epilogue) then F.gelu: the pre-activation round-trips HBM"""
    return F.gelu(F.linear(x, w, b), approximate=approximate)


_compiled = {a: compiled(lambda x, w, b, a=a: F.gelu(F.linear(x, w, b), approximate=a))
             for a in APPROXIMATE}


@op.impl("torch_compile", backend="compile")
def linear_gelu_compile(x, w, b, approximate="none"):
    """torch.compile(F.gelu(F.linear(...))), default mode, one compile per shape"""
    return _compiled[approximate](x, w, b)


@op.impl("triton", backend="triton", accepts_out=True, expected_kernels=1,
         tuners=triton_matmul._tuner)
def linear_gelu_triton(x, w, b, approximate="none", out=None):
    """Triton matmul (grouped order, fp32 acc) with bias + GELU fused into the epilogue: the
    persistent TMA form where K and N allow it, else pointer loads (TMA field)"""
    return triton_matmul.matmul_bias_act(x, w, b, act=ACT[approximate], out=out)


def _tma_unavailable(p, dtype, device):
    return triton_matmul_tma.tma_unsupported({"K": p.K, "N": p.N}, getattr(torch, dtype))


@op.impl("triton_tma", backend="triton", accepts_out=True, expected_kernels=1,
         unavailable=_tma_unavailable, tuners=triton_matmul_tma._tuner)
def linear_gelu_triton_tma(x, w, b, approximate="none", out=None):
    """Triton persistent matmul, A and W tiles through TMA descriptors, bias + GELU epilogue"""
    return triton_matmul_tma.matmul_bias_act_tma(x, w, b, act=ACT[approximate], out=out)
