"""Op `add_layernorm`: residual add fused into LayerNorm (pre-norm transformer blocks).

    h = x + residual          (M, N), written out: the next residual branch needs it
    y = LayerNorm(h; w, b)    (M, N), eps 1e-5

Traffic: read M·N of x and of residual, N each of w and b; write M·N of h and of y
-> bytes = (4·M·N + 2·N)·itemsize. Unfused (torch eager) the add writes h and LayerNorm reads it
back: 5·M·N. FLOPs: 8 per element (the add + LayerNorm's 7).

The Triton kernel normalises the fp32 sum (before h is rounded to the dtype): y is LN of the
exact x + residual, which is what the fp32 reference computes.

Implementations: torch (x + residual, then F.layer_norm), torch_compile, triton (the one-pass
LayerNorm kernel of kernels/layernorm with its HAS_RES path).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.registry import Op, Param
from kernels._common import compiled
from kernels.layernorm import make_ln_params
from kernels.layernorm import triton_layernorm
from kernels.layernorm.triton_layernorm import EPS, layernorm_fwd

op = Op(
    "add_layernorm",
    params=[Param("M", int, help="rows (tokens)", size=True), Param("N", int, help="hidden width")],
    dtypes=("float16", "bfloat16", "float32"),
    primary="gbps",
    description="h = x + residual; y = LayerNorm(h): one read of x and residual, one write "
                "of h and y",
)


@op.inputs
def make_inputs(p, dtype, device, gen):
    x = torch.randn(p.M, p.N, device=device, dtype=torch.float32, generator=gen).to(dtype)
    # the residual stream is typically larger than the branch output and not zero-mean
    res = (3.0 * torch.randn(p.M, p.N, device=device, dtype=torch.float32, generator=gen)
           + 0.3).to(dtype)
    w, b = make_ln_params(p.N, dtype, device, gen)
    return x, res, w, b


def _add_ln(x, res, w, b):
    h = x + res
    return h, F.layer_norm(h, (h.shape[-1],), w, b, EPS)


@op.reference
def reference(x, res, w, b):
    return _add_ln(x, res, w, b)


@op.flops
def flops(p):
    return 8.0 * p.M * p.N


@op.bytes
def nbytes(p, itemsize):
    return (4.0 * p.M * p.N + 2.0 * p.N) * itemsize


@op.output
def output(inputs, p):
    """One (2, M, N) buffer: [0] receives h, [1] receives y (so both get NaN-poisoned)."""
    x = inputs[0]
    return torch.empty((2, *x.shape), device=x.device, dtype=x.dtype)


@op.impl("torch", backend="torch")
def add_ln_torch(x, res, w, b):
    """x + residual, then F.layer_norm (eager: two kernels, h written and read back)"""
    return _add_ln(x, res, w, b)


_compiled = compiled(_add_ln)


@op.impl("torch_compile", backend="compile")
def add_ln_compile(x, res, w, b):
    """torch.compile of the add + F.layer_norm, one compile per shape"""
    return _compiled(x, res, w, b)


@op.impl("triton", backend="triton", accepts_out=True, expected_kernels=1,
         tuners=triton_layernorm._tuner)
def add_ln_triton(x, res, w, b, out=None):
    """Triton: one kernel; rows in registers; writes h and y in the same pass"""
    h_out, y_out = (None, None) if out is None else (out[0], out[1])
    return layernorm_fwd(x, w, b, residual=res, out=y_out, h_out=h_out)
