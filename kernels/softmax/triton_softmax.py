"""Row softmax in Triton.

Short rows (N <= MAX_FUSED): one program per row keeps the whole row in registers — one read
and one write of every element, the minimum traffic (2·M·N·itemsize bytes).

Long rows: the row is split over several programs ("multi-block") so that even a handful of
rows fills the GPU. Kernel 1 writes each segment's (max, sum of exp) — online-softmax partials;
kernel 2 combines a row's partials (a few floats) and normalises its segment. Traffic: two
reads and one write of the matrix.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import Tuner

MAX_FUSED = 32768  # elements per row kept in registers by the one-pass kernel
SEGMENT = 4096  # elements per program in the split-row kernels

# candidates per row length: the warp counts with at least one element per thread
_tuner = Tuner("softmax", ("num_warps",), values={"num_warps": (1, 4, 8, 16, 32)})


@triton.jit
def _softmax_rows(x_ptr, y_ptr, x_stride, y_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # read N elements
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    # write N elements
    tl.store(y_ptr + row * y_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_partials(x_ptr, m_ptr, l_ptr, x_stride, n_cols, n_seg,
                      SEG: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    m = tl.full([BLOCK], -float("inf"), tl.float32)
    l = tl.zeros([BLOCK], tl.float32)
    for start in range(0, SEG, BLOCK):
        cols = seg * SEG + start + tl.arange(0, BLOCK)
        # read N elements (first pass)
        x = tl.load(x_ptr + row * x_stride + cols, mask=cols < n_cols,
                    other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        seen = m_new != -float("inf")  # lanes that have met a finite value
        alpha = tl.where(seen, tl.exp(m - m_new), 0.0)
        beta = tl.where(seen, tl.exp(x - m_new), 0.0)
        l = l * alpha + beta
        m = m_new
    m_seg = tl.max(m, axis=0)
    l_seg = tl.sum(l * tl.exp(m - m_seg), axis=0)
    tl.store(m_ptr + row * n_seg + seg, m_seg)
    tl.store(l_ptr + row * n_seg + seg, l_seg)


@triton.jit
def _softmax_normalise(x_ptr, y_ptr, m_ptr, l_ptr, x_stride, y_stride, n_cols, n_seg,
                       SEG: tl.constexpr, BLOCK: tl.constexpr, P: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    p = tl.arange(0, P)
    pm = tl.load(m_ptr + row * n_seg + p, mask=p < n_seg, other=-float("inf"))
    pl = tl.load(l_ptr + row * n_seg + p, mask=p < n_seg, other=0.0)
    m = tl.max(pm, axis=0)
    l = tl.sum(pl * tl.exp(pm - m), axis=0)
    inv = 1.0 / l
    for start in range(0, SEG, BLOCK):
        cols = seg * SEG + start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        # read N elements (second pass) ; write N elements
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        y = tl.exp(x - m) * inv
        tl.store(y_ptr + row * y_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last dim of a 2-D tensor x (M, N); returns out (M, N), x's dtype."""
    if x.dim() != 2:
        raise ValueError(f"softmax expects a 2-D tensor, got shape {tuple(x.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    M, N = x.shape
    y = torch.empty_like(x) if out is None else out
    if N <= MAX_FUSED:
        block = triton.next_power_of_2(N)

        def launch(warps):
            _softmax_rows[(M,)](x, y, x.stride(0), y.stride(0), N, BLOCK=block,
                                num_warps=warps)

        cands = [w for w in (4, 8, 16, 32) if block // (32 * w) >= 1] or [1]
        launch(_tuner.pick(("rows", N, x.dtype), cands, launch))
        return y
    n_seg = triton.cdiv(N, SEGMENT)
    m = torch.empty((M, n_seg), device=x.device, dtype=torch.float32)
    l = torch.empty_like(m)
    _softmax_partials[(M, n_seg)](x, m, l, x.stride(0), N, n_seg, SEG=SEGMENT, BLOCK=1024,
                                  num_warps=4)
    _softmax_normalise[(M, n_seg)](x, y, m, l, x.stride(0), y.stride(0), N, n_seg,
                                   SEG=SEGMENT, BLOCK=1024, P=triton.next_power_of_2(n_seg),
                                   num_warps=4)
    return y


def kernels_launched(N: int) -> int:
    return 1 if N <= MAX_FUSED else 2
