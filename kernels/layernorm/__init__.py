"""Op `layernorm`: LayerNorm over the last dim of an (M, N) matrix with weight and bias
(eps 1e-5), forward (`mode=fwd`) or backward (`mode=bwd`).

fwd: y = (x - mean) * rstd * w + b. Traffic: read M·N of x and N each of w, b; write M·N of y
  -> bytes = (2·M·N + 2·N)·itemsize. FLOPs: 7 per element (mean sum, x - mean, square and
  accumulate, · rstd, · w, + b); sqrt/rsqrt are not counted (as ncu does not count them either).
bwd: the gradients (dx, dw, db) of a forward done outside the measured region
  (torch.autograd.grad with retain_graph, so each timed call re-runs only the backward).
  Traffic: read M·N of x and of dy, N of w; write M·N of dx and N each of dw, db
  -> bytes = (3·M·N + 3·N)·itemsize; the M-float mean/rstd the forward saved could be
  recomputed from x, so they are not counted. FLOPs: 12 per element (xhat: 2, g = dy·w: 1,
  the two row sums: 4, dx: 3, dw/db accumulation: 2... counted as 12).

Implementations: torch (F.layer_norm, eager), torch_compile, triton (kernels in
triton_layernorm.py and triton_layernorm_bwd.py, differentiable via LayerNormFn).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.registry import Op, Param
from kernels._common import compiled
from kernels.layernorm import triton_layernorm, triton_layernorm_bwd

EPS = triton_layernorm.EPS

op = Op(
    "layernorm",
    params=[Param("M", int, help="rows (tokens)", size=True),
            Param("N", int, help="normalised width"),
            Param("mode", str, choices=("fwd", "bwd"), default="fwd",
                  help="fwd: y = LN(x); bwd: (dx, dw, db) of a forward done beforehand")],
    dtypes=("float16", "bfloat16", "float32"),
    primary="gbps",
    description="LayerNorm over the last dim of (M, N), weight and bias, forward or backward",
)


def make_ln_params(n: int, dtype, device, gen):
    """Affine parameters near their trained values: w ~ 1 + 0.1·N(0,1), b ~ 0.1·N(0,1)."""
    w = 1.0 + 0.1 * torch.randn(n, device=device, dtype=torch.float32, generator=gen)
    b = 0.1 * torch.randn(n, device=device, dtype=torch.float32, generator=gen)
    return w.to(dtype), b.to(dtype)


@op.inputs
def make_inputs(p, dtype, device, gen):
    # activations with a non-zero mean, so that the variance computation is exercised
    x = (2.0 * torch.randn(p.M, p.N, device=device, dtype=torch.float32, generator=gen)
         + 0.5).to(dtype)
    w, b = make_ln_params(p.N, dtype, device, gen)
    if p.mode == "fwd":
        return x, w, b
    dy = torch.randn(p.M, p.N, device=device, dtype=torch.float32, generator=gen).to(dtype)
    return x, w, b, dy


@op.reference
def reference(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


@op.binder
def bind(fn, inputs, p, out):
    """fwd: fn(x, w, b[, out]). bwd: forward once here (not timed), then time the backward."""
    if p.mode == "fwd":
        x, w, b = inputs
        kw = {} if out is None else {"out": out}
        return lambda: fn(x, w, b, **kw)
    x, w, b, dy = inputs
    leaves = tuple(t.detach().requires_grad_(True) for t in (x, w, b))
    with torch.enable_grad():
        y = fn(*leaves)
    return lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True)


@op.flops
def flops(p):
    return (7.0 if p.mode == "fwd" else 12.0) * p.M * p.N


@op.bytes
def nbytes(p, itemsize):
    if p.mode == "fwd":
        return (2.0 * p.M * p.N + 2.0 * p.N) * itemsize
    return (3.0 * p.M * p.N + 3.0 * p.N) * itemsize


@op.output
def output(inputs, p):
    return torch.empty_like(inputs[0]) if p.mode == "fwd" else None


def _triton_kernels(p) -> int:
    return 1 if p.mode == "fwd" else 2


def _triton_unavailable(p, dtype, device):
    if p.mode == "bwd" and p.N > triton_layernorm_bwd.MAX_BWD:
        return f"the Triton backward keeps a row in registers (N <= {triton_layernorm_bwd.MAX_BWD})"
    return None


@op.impl("torch", backend="torch")
def ln_torch(x, w, b):
    """F.layer_norm (eager; its own forward and backward kernels)"""
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


_compiled_ln = compiled(lambda a, c, d: F.layer_norm(a, (a.shape[-1],), c, d, EPS))


@op.impl("torch_compile", backend="compile")
def ln_compile(x, w, b):
    """torch.compile(F.layer_norm), one compile per shape (and per mode)"""
    return _compiled_ln(x, w, b)


@op.impl("triton", backend="triton", accepts_out=True, expected_kernels=_triton_kernels,
         unavailable=_triton_unavailable,
         tuners={"": triton_layernorm._tuner, "bwd": triton_layernorm_bwd._tuner})
def ln_triton(x, w, b, out=None):
    """Triton: rows in registers (several per program when short); backward with dw/db
    partials per program + a column-sum kernel"""
    return triton_layernorm_bwd.layernorm(x, w, b, out=out)
