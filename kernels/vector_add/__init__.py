"""Op `vector_add`: z = x + y over 1-D tensors of N elements — the bandwidth "hello world".

Traffic: read N elements of x and N of y, write N of z -> bytes = 3·N·itemsize; nothing can be
saved, so the copy roof (read + write) is the ceiling. FLOPs: N (one add per element).
"""
from __future__ import annotations

import torch

from harness.registry import Op, Param
from kernels._common import compiled
from kernels.vector_add import triton_vector_add

op = Op(
    "vector_add",
    params=[Param("N", int, help="elements", size=True)],
    dtypes=("float16", "bfloat16", "float32"),
    primary="gbps",
    description="z = x + y over 1-D tensors (memory-bound: 3 N itemsize bytes)",
)


@op.inputs
def make_inputs(p, dtype, device, gen):
    x = torch.randn(p.N, device=device, dtype=torch.float32, generator=gen).to(dtype)
    y = torch.randn(p.N, device=device, dtype=torch.float32, generator=gen).to(dtype)
    return x, y


@op.reference
def reference(x, y):
    return x + y


@op.flops
def flops(p):
    return float(p.N)


@op.bytes
def nbytes(p, itemsize):
    return 3.0 * p.N * itemsize


@op.output
def output(inputs, p):
    return torch.empty_like(inputs[0])


@op.impl("torch", backend="torch", accepts_out=True, expected_kernels=1)
def add_torch(x, y, out=None):
    """torch.add (eager), writing into the given output"""
    return torch.add(x, y, out=out)


_compiled_add = compiled(lambda a, b: a + b)


@op.impl("torch_compile", backend="compile", expected_kernels=1)
def add_compile(x, y):
    """torch.compile(x + y), one compile per shape"""
    return _compiled_add(x, y)


@op.impl("triton", backend="triton", accepts_out=True, expected_kernels=1,
         tuners=triton_vector_add._tuner)
def add_triton(x, y, out=None):
    """Triton: one BLOCK slice per program, 16-byte accesses, BLOCK/num_warps tuned"""
    return triton_vector_add.vector_add(x, y, out=out)
