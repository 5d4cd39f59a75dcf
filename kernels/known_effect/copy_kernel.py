"""The known-effect copy: one launch copies x to y and `extra` x that many elements of pad to
scratch, so it moves exactly (1 + extra) x the bytes of a copy (up to one element)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import Tuner

# (BLOCK, num_warps): one configuration, so nothing is timed to pick it (the self-test changes
# bytes, never launch configs); the values are there for a YAML that wants to force others
CONFIGS: tuple[tuple[int, int], ...] = ((4096, 4),)
MAX_EXTRA = 0.10  # pad/scratch hold this fraction of x

_tuner = Tuner("known_effect.copy", ("BLOCK", "num_warps"), configs=CONFIGS,
               values={"BLOCK": (1024, 2048, 4096, 8192), "num_warps": (2, 4, 8)})


# n_extra and main_blocks are not specialised: every EXTRA runs one binary (Triton would
# otherwise compile another when n_extra's divisibility by 16 changes, and that binary's own
# speed would blur the effect)
@triton.jit(do_not_specialize=["n_extra", "main_blocks"])
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

    def launch(config: tuple[int, int]) -> None:
        block, warps = config
        main = triton.cdiv(n, block)
        grid = (main + triton.cdiv(n_extra, block),)
        _copy_kernel[grid](x, y, n, pad, scratch, n_extra, main, BLOCK=block, num_warps=warps)

    launch(_tuner.pick((n, x.dtype), CONFIGS, launch))
    return y
