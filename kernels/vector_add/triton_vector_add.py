"""Element-wise z = x + y over 1-D tensors in Triton: the bandwidth "hello world".

Each program adds one BLOCK-element slice. Every element is read twice (x, y) and written once,
so the kernel can do no better than the copy roof. What decides how close it gets:

- 16-byte accesses: contiguous offsets with a divisible-by-16 base let Triton emit 128-bit
  loads/stores (8 fp16 or 4 fp32 per instruction); BLOCK / (32 * num_warps) elements per thread
  means several of them in flight per thread.
- enough bytes in flight per SM: BLOCK and num_warps are picked by the Tuner per (N, dtype).
- no mask but in the last block (none at all when N is a multiple of BLOCK: EVEN), so the hot
  path has no predicate math and keeps its 16-byte accesses for any N.
- int64 offsets: N may exceed 2**31 elements.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import Tuner

# (BLOCK, num_warps): the first is the default in the interpreter (the Tuner does not time there)
CONFIGS: tuple[tuple[int, int], ...] = (
    (4096, 4), (2048, 4), (8192, 8), (4096, 8), (16384, 8), (8192, 4),
)

_tuner = Tuner("vector_add", ("BLOCK", "num_warps"), configs=CONFIGS,
               values={"BLOCK": (1024, 2048, 4096, 8192, 16384), "num_warps": (1, 2, 4, 8, 16)})


@triton.jit
def _add(x, y):
    """x + y in fp32, rounded to the inputs' dtype. fp32 carries >= 2p + 2 bits for fp16 and
    bf16, so rounding twice equals the correctly rounded half add; it also sidesteps the
    interpreter, which adds bf16 bit patterns as integers."""
    return (x.to(tl.float32) + y.to(tl.float32)).to(x.dtype)


@triton.jit
def _add_full(x_ptr, y_ptr, z_ptr, offs):
    # read BLOCK elements of x and of y (no mask: 16-byte vector accesses)
    x = tl.load(x_ptr + offs, eviction_policy="evict_first")
    y = tl.load(y_ptr + offs, eviction_policy="evict_first")
    # write BLOCK elements of z
    tl.store(z_ptr + offs, _add(x, y))


@triton.jit
def _add_kernel(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    if EVEN:
        _add_full(x_ptr, y_ptr, z_ptr, offs)
    elif start + BLOCK <= n:
        # every block but the last stays unmasked even when N is odd: a mask on a length that
        # is not a multiple of 16 would forbid vectorised accesses in all of them
        _add_full(x_ptr, y_ptr, z_ptr, offs)
    else:
        mask = offs < n
        # read the tail of x and of y
        x = tl.load(x_ptr + offs, mask=mask, eviction_policy="evict_first")
        y = tl.load(y_ptr + offs, mask=mask, eviction_policy="evict_first")
        # write the tail of z
        tl.store(z_ptr + offs, _add(x, y), mask=mask)


def launch(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, config: tuple[int, int]) -> None:
    """One launch of the kernel with `config` = (BLOCK, num_warps); x, y, z contiguous (N,)."""
    block, warps = config
    n = x.numel()
    grid = (triton.cdiv(n, block),)
    _add_kernel[grid](x, y, z, n, BLOCK=block, EVEN=(n % block == 0), num_warps=warps)


def vector_add(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None,
               config: tuple[int, int] | None = None) -> torch.Tensor:
    """z = x + y for contiguous 1-D x, y of shape (N,) and the same dtype; returns z (N,).

    `config` forces a (BLOCK, num_warps) pair instead of the tuned one (benchmarks, tests).
    """
    if x.shape != y.shape or x.dim() != 1:
        raise ValueError(f"vector_add expects two 1-D tensors of one shape, got "
                         f"{tuple(x.shape)} and {tuple(y.shape)}")
    if x.dtype != y.dtype:
        raise ValueError(f"vector_add expects one dtype, got {x.dtype} and {y.dtype}")
    x, y = x.contiguous(), y.contiguous()
    z = torch.empty_like(x) if out is None else out
    if z.numel() == 0:
        return z
    if config is None:
        config = _tuner.pick((x.numel(), x.dtype), CONFIGS, lambda c: launch(x, y, z, c))
    launch(x, y, z, config)
    return z
