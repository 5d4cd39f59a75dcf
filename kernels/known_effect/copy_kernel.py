"""The known-effect copy: one launch copies x to y and `extra` x that many elements of pad to
scratch, so it moves exactly (1 + extra) x the bytes of a copy (up to one element), spread
evenly over its programs."""
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


# The extra blocks are spread over the grid (every `stride`-th program copies one after its own
# block) rather than run as a tail of extra programs: a tail adds its own partial wave, and on
# an H100 "+1 % bytes" as a tail cost +2.3 % (180 us) to +9.7 % (13 us) of time. n_extra and
# stride are not specialised, so every EXTRA runs one binary (Triton compiled another one when
# n_extra's divisibility by 16 changed, and that binary's own speed blurred the effect).
@triton.jit(do_not_specialize=["n_extra", "stride"])
def _copy_kernel(x_ptr, y_ptr, n, pad_ptr, scratch_ptr, n_extra, stride,
                 BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # read BLOCK elements of x; write BLOCK elements of y
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)
    if n_extra > 0:
        if pid % stride == 0:
            # the known effect: this program also reads a block of pad and writes it to scratch
            offs = (pid // stride).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n_extra
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
        extra_blocks = triton.cdiv(n_extra, block)
        if extra_blocks > main:  # more extra than copy blocks: cannot happen below MAX_EXTRA
            raise ValueError(f"{extra_blocks} extra blocks exceed the copy's {main}")
        # programs 0, stride, 2 stride, ... copy extra blocks 0, 1, 2, ...: all of them, as
        # (extra_blocks - 1) * stride < main
        stride = main // extra_blocks if extra_blocks else 1
        _copy_kernel[(main,)](x, y, n, pad, scratch, n_extra, stride, BLOCK=block,
                              num_warps=warps)

    launch(_tuner.pick((n, x.dtype), CONFIGS, launch))
    return y
