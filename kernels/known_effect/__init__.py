"""Op `known_effect`: y = x, a copy whose Triton kernel moves EXTRA more bytes than it needs.

The harness's self-test of "measure": with EXTRA = 0.02 the Triton copy also reads and writes
2 % of its bytes again (elsewhere, in the same launch), so it is ~2 % slower wherever it is
memory-bound, by construction. tools/device/known_effect.py copies this package into a
throwaway git repository (as `ke_user`, op `known_effect_user`), commits it with EXTRA 0, 0,
0.01, 0.02 and 0.05, and reads what `harness ab` and run-to-run `compare` make of each step.
Only the lines `NAME = ...` and `EXTRA = ...` are edited there: keep them one line each.

Traffic: read M N elements of x, write M N of y -> bytes = 2 M N itemsize (the copy roof);
the Triton kernel moves EXTRA x that on top (read and write EXTRA M N elements of pad/scratch).
"""
from __future__ import annotations

import math

import torch

from harness.registry import Op, Param

from . import copy_kernel

NAME = "known_effect"
EXTRA = 0.0
MAX_EXTRA = copy_kernel.MAX_EXTRA

op = Op(
    NAME,
    params=[Param("M", int, help="rows", size=True), Param("N", int, help="columns")],
    dtypes=("float16", "bfloat16", "float32"),
    primary="gbps",
    description="y = x, the Triton copy moving EXTRA more bytes (the harness's self-test)",
)


@op.inputs
def make_inputs(p, dtype, device, gen):
    """x (M, N); pad and scratch (MAX_EXTRA M N,): where the extra bytes come from and go."""
    x = torch.randn(p.M, p.N, device=device, dtype=torch.float32, generator=gen).to(dtype)
    spare = math.ceil(MAX_EXTRA * p.M * p.N)
    pad = torch.randn(spare, device=device, dtype=torch.float32, generator=gen).to(dtype)
    return x, pad, torch.empty(spare, device=device, dtype=dtype)


@op.reference
def reference(x, pad, scratch):
    return x.clone()


@op.flops
def flops(p):
    return 0.0


@op.bytes
def nbytes(p, itemsize):
    return 2.0 * p.M * p.N * itemsize


@op.output
def output(inputs, p):
    return torch.empty_like(inputs[0])


@op.impl("torch", backend="torch", accepts_out=True, expected_kernels=1)
def copy_torch(x, pad, scratch, out=None):
    """out.copy_(x): the unchanged control"""
    return out.copy_(x) if out is not None else x.clone()


@op.impl("triton", backend="triton", accepts_out=True, expected_kernels=1,
         tuners=copy_kernel._tuner)
def copy_triton(x, pad, scratch, out=None):
    """Triton copy, one BLOCK per program, plus EXTRA of the bytes moved again"""
    return copy_kernel.copy(x, pad, scratch, EXTRA, out=out)
