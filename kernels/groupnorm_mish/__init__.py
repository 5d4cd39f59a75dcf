"""Op `groupnorm_mish`: GroupNorm (G groups, affine, eps 1e-5) then Mish on NCHW activations,
as in diffusion U-Net ResNet blocks.

    x: (N, C, H, W)   w, b: (C,)   y = mish(GroupNorm(x))   (N, C, H, W)

Traffic: read N·C·H·W of x and C each of w, b; write N·C·H·W of y
-> bytes = (2·N·C·H·W + 2·C)·itemsize. Eager torch reads x twice in GroupNorm (statistics, then
normalise), writes the normalised tensor, and Mish reads it back and writes y: ~5 passes.
FLOPs: 12 per element (GroupNorm's 7 as in layernorm, Mish's 5: e + 2, e·(e + 2), n + 2, the
division, v·); exp is not counted.

Implementations: torch (F.group_norm then F.mish, eager), torch_compile, triton (one program
per group; or a group over several programs synchronised inside one kernel; or a group split
over several programs in two kernels: kernels/groupnorm_mish/triton_groupnorm_mish.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.registry import Op, Param
from kernels._common import compiled
from kernels.groupnorm_mish import triton_groupnorm_mish

EPS = 1e-5

op = Op(
    "groupnorm_mish",
    params=[Param("N", int, help="batch", size=True), Param("C", int, help="channels"),
            Param("H", int, help="height"), Param("W", int, help="width"),
            Param("G", int, help="groups (divides C)")],
    dtypes=("float16", "bfloat16", "float32"),
    primary="gbps",
    description="GroupNorm + Mish on NCHW, statistics and activation in one kernel",
)


@op.inputs
def make_inputs(p, dtype, device, gen):
    if p.C % p.G:
        raise ValueError(f"C={p.C} must be divisible by G={p.G}")
    x = (1.5 * torch.randn(p.N, p.C, p.H, p.W, device=device, dtype=torch.float32,
                           generator=gen) + 0.2).to(dtype)
    w = (1.0 + 0.1 * torch.randn(p.C, device=device, dtype=torch.float32, generator=gen))
    b = 0.1 * torch.randn(p.C, device=device, dtype=torch.float32, generator=gen)
    return x, w.to(dtype), b.to(dtype)


@op.call_kwargs
def call_kwargs(p):
    return {"groups": p.G}


def _gn_mish(x, w, b, groups):
    return F.mish(F.group_norm(x, groups, w, b, EPS))


@op.reference
def reference(x, w, b, groups):
    return _gn_mish(x, w, b, groups)


@op.flops
def flops(p):
    return 12.0 * p.N * p.C * p.H * p.W


@op.bytes
def nbytes(p, itemsize):
    return (2.0 * p.N * p.C * p.H * p.W + 2.0 * p.C) * itemsize


@op.output
def output(inputs, p):
    return torch.empty_like(inputs[0])


@op.impl("torch", backend="torch")
def gn_mish_torch(x, w, b, groups):
    """F.group_norm then F.mish (eager)"""
    return _gn_mish(x, w, b, groups)


_compiled = compiled(_gn_mish)


@op.impl("torch_compile", backend="compile")
def gn_mish_compile(x, w, b, groups):
    """torch.compile of F.group_norm + F.mish, one compile per shape"""
    return _compiled(x, w, b, groups)


@op.impl("triton", backend="triton", accepts_out=True,
         expected_kernels=lambda p: triton_groupnorm_mish.kernels_launched(),
         tuners=triton_groupnorm_mish._tuner)
def gn_mish_triton(x, w, b, groups, out=None):
    """Triton: one program per group (statistics + normalise + Mish in one kernel), several
    per group synchronised in one kernel (x read once), or several per group in two kernels
    (partial sums, then normalise + Mish), as the Tuner picks"""
    return triton_groupnorm_mish.groupnorm_mish(x, groups, w, b, EPS, out=out)
