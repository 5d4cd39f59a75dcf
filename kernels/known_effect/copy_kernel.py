"""The known-effect copy: one launch copies x to y and `extra` x that many elements of pad to
scratch, so it moves exactly (1 + extra) x the bytes of a copy (up to one element)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096
NUM_WARPS = 4
MAX_EXTRA = 0.10  # pad/scratch hold this fraction of x


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, pad_ptr, scratch_ptr, n_extra, main_blocks,
                 BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if pid < main_blocks:
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        # read BLOCK elements of x; write BLOCK elements of y
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)
    else:
        offs = (pid - main_blocks).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n_extra
        # the known effect: read n_extra elements of pad; write them to scratch
        tl.store(scratch_ptr + offs, tl.load(pad_ptr + offs, mask=mask), mask=mask)


def copy(x: torch.Tensor, pad: torch.Tensor, scratch: torch.Tensor, extra: float,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x (any shape, contiguous), moving `extra` (0 <= extra <= MAX_EXTRA) more bytes."""
    if not 0 <= extra <= MAX_EXTRA:
        raise ValueError(f"extra must be within [0, {MAX_EXTRA}], got {extra}")
    x = x.contiguous()
    y = torch.empty_like(x) if out is None else out
    n = x.numel()
    n_extra = min(round(extra * n), pad.numel(), scratch.numel())
    main = triton.cdiv(n, BLOCK)
    grid = (main + triton.cdiv(n_extra, BLOCK),)
    _copy_kernel[grid](x, y, n, pad, scratch, n_extra, main, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return y
