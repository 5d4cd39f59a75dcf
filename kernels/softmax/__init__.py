"""Op `softmax`: softmax over the rows of an (M, N) matrix.

Traffic: read M·N elements, write M·N elements -> bytes = 2·M·N·itemsize (the floor; the
long-row Triton path reads twice). FLOPs: 3 per element (x - max, the running sum, the scale);
exp and max are not FLOPs to ncu either.
"""
from __future__ import annotations

import torch

from harness.registry import Op, Param
from kernels._common import compiled
from kernels.softmax import triton_softmax

op = Op(
    "softmax",
    params=[Param("M", int, help="rows", size=True), Param("N", int, help="row length")],
    dtypes=("float16", "bfloat16", "float32"),
    primary="gbps",
    description="softmax over the last dim of an (M, N) matrix",
)


@op.inputs
def make_inputs(p, dtype, device, gen):
    # scaled so that exp() sees a realistic spread (attention-like logits)
    x = torch.randn(p.M, p.N, device=device, dtype=torch.float32, generator=gen) * 3.0
    return (x.to(dtype),)


@op.reference
def reference(x):
    return torch.softmax(x, dim=-1)


@op.flops
def flops(p):
    return 3.0 * p.M * p.N


@op.bytes
def nbytes(p, itemsize):
    return 2.0 * p.M * p.N * itemsize


@op.output
def output(inputs, p):
    return torch.empty_like(inputs[0])


@op.impl("torch", backend="torch", expected_kernels=1)
def softmax_torch(x):
    """torch.softmax (eager)"""
    return torch.softmax(x, dim=-1)


_compiled_softmax = compiled(lambda t: torch.softmax(t, dim=-1))


@op.impl("torch_compile", backend="compile")
def softmax_compile(x):
    """torch.compile(torch.softmax), one compile per shape"""
    return _compiled_softmax(x)


@op.impl("triton", backend="triton", accepts_out=True,
         expected_kernels=lambda p: triton_softmax.kernels_launched(p.N),
         tuners=triton_softmax._tuner)
def softmax_triton(x, out=None):
    """fused Triton softmax: one pass per row; split rows over programs when long"""
    return triton_softmax.softmax(x, out=out)
