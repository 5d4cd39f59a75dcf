"""GroupNorm + Mish in Gluon (Hopper): persistent programs that hold whole groups in shared
memory, double-buffered, a TMA producer warp loading group i+1 while the other warps normalise
group i. The groupnorm_mish Tuner's `SYNC: 2`.

Why: every Triton form, and a first Gluon form that held each program's share of a group in
shared memory (4ac2362, reverted), ran the 80 MiB SD shapes at 30-34 us where a copy of the
same bytes takes 21-23 us on an H200, with neither DRAM (31-43 %) nor the issue slots (42-52 %)
busy. A program must read its whole group before it can write any of it, and programs that
start together (a wave dispatched at once, the same work each) stay in step: they load at the
same time and compute at the same time, so DRAM and the SMs take turns instead of overlapping.
Here the overlap is built in: one program per SM walks groups pid, pid + P, ...; its 1-warp
producer partition (24 registers) TMA-loads group i+1 into the other buffer (8 KiB boxes, one
mbarrier per buffer) while the default partition's warps reduce group i from shared memory,
normalise it, apply Mish, write y over x's boxes and send them out with TMA stores; a buffer is
handed back (its `empty` barrier) once its stores have read it.

Per group (L = (C/G)·H·W elements, one contiguous run of NCHW viewed as rows of 256; H·W a
multiple of 256 keeps every row in one channel): shifted sums over the group (shift: its first
element, as the Triton forms), mean and rstd, then y = mish((x - mean) rstd w + b) box by box.
x is read from DRAM once, y written once.
Limits: sm_90, fp16/bf16, H·W a multiple of 256, a group of whole 4096-element boxes and two
of them in shared memory (L <= MAX_GROUP); elsewhere the Tuner offers the Triton forms only.
Gluon kernels do not run in the CPU interpreter: CI builds this one for sm_90 and tests the
host side.
"""
from __future__ import annotations

import torch

from kernels._common import interpreted

try:  # Gluon: triton >= 3.5
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                                  tma)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # renamed after 3.6
except ImportError:  # pragma: no cover
    gluon = None

ROW = 256  # elements per TMA box row (512 B in 16-bit)
BOX_ROWS = 16  # rows per box: 4096 elements, 8 KiB
BOX = ROW * BOX_ROWS
MAX_GROUP = 53248  # elements of a group: two buffers of them in 208 KiB of shared memory
WARPS = (8, 4)


if gluon is not None:
    @gluon.jit
    def _mish(v):
        """mish(v) = v n / (n + 2), n = e(e + 2), e = exp(min(v, 20)) (as the Triton forms:
        ex2.approx.ftz, an approximate division)."""
        e = gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r",
                                      [gl.minimum(v, 20.0) * 1.4426950408889634],
                                      dtype=gl.float32, is_pure=True, pack=1)
        n = e * (e + 2.0)
        return gl.fdiv(v * n, n + 2.0)

    @gluon.jit
    def _gn_load(desc_x, bufs, ready, empty, n_groups, NB: gl.constexpr):
        """Producer: group g's NB boxes into buffer i % 2 once the consumers freed it."""
        BR: gl.constexpr = desc_x.block_type.shape[0]
        i = 0
        for g in range(gl.program_id(0), n_groups, gl.num_programs(0)):
            b = i % 2
            mbarrier.wait(empty.index(b), ((i // 2) & 1) ^ 1)  # a fresh barrier passes
            mbarrier.expect(ready.index(b), NB * desc_x.block_type.nbytes)
            # read L elements of x (TMA, DRAM once)
            for k in gl.static_range(NB):
                _tma_load(desc_x, [(g * NB + k) * BR, 0], ready.index(b),
                          bufs.index(b * NB + k))
            i += 1

    @gluon.jit
    def _gn_apply(desc_y, x_ptr, w_ptr, b_ptr, bufs, ready, empty, n_groups, CPG, G, eps,
                  HW: gl.constexpr, NB: gl.constexpr):
        """Consumers: statistics, normalise + Mish, y over x's boxes, TMA stores."""
        nw: gl.constexpr = gl.num_warps()
        BR: gl.constexpr = desc_y.block_type.shape[0]
        R: gl.constexpr = desc_y.block_type.shape[1]
        L: gl.constexpr = NB * BR * R
        dtype: gl.constexpr = desc_y.dtype
        blk: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [nw, 1], [1, 0])
        r = gl.arange(0, BR, layout=gl.SliceLayout(1, blk))
        i = 0
        for g in range(gl.program_id(0), n_groups, gl.num_programs(0)):
            b = i % 2
            # read 1 element of x (the group's shift)
            shift = gl.load(x_ptr + g.to(gl.int64) * L).to(gl.float32)
            mbarrier.wait(ready.index(b), (i // 2) & 1)
            s1 = gl.zeros([BR, R], gl.float32, layout=blk)
            s2 = gl.zeros([BR, R], gl.float32, layout=blk)
            for k in gl.static_range(NB):
                d = bufs.index(b * NB + k).load(blk).to(gl.float32) - shift
                s1 += d
                s2 += d * d
            m1 = gl.sum(gl.sum(s1, axis=1), axis=0) / L
            rstd = 1.0 / gl.sqrt(gl.maximum(gl.sum(gl.sum(s2, axis=1), axis=0) / L - m1 * m1,
                                            0.0) + eps)
            for k in gl.static_range(NB):
                wc = (g % G) * CPG + (k * (BR * R) + r * R) // HW  # each row in one channel
                # read BR of w and of b (L1/L2)
                a = rstd * gl.load(w_ptr + wc).to(gl.float32)
                bb = gl.load(b_ptr + wc).to(gl.float32) - m1 * a
                box = bufs.index(b * NB + k)
                d = box.load(blk).to(gl.float32) - shift
                box.store(_mish(d * gl.expand_dims(a, 1) + gl.expand_dims(bb, 1)).to(dtype))
                fence_async_shared()
                _cta_barrier()  # every thread's part of the box written before the copy
                # write BR x 256 of y (TMA, DRAM once)
                _tma_store(desc_y, [(g * NB + k) * BR, 0], box)
            tma.store_wait(0)  # the stores have read the buffer: the producer may refill it
            mbarrier.arrive(empty.index(b), count=1)
            i += 1

    @gluon.jit
    def _gn_mish_persistent(desc_x, desc_y, x_ptr, w_ptr, b_ptr, n_groups, CPG, G, eps,
                            HW: gl.constexpr, NB: gl.constexpr):
        """desc_x, desc_y: x, y as (numel / 256, 256) rows in 16 x 256 boxes; a group is NB
        boxes; programs walk groups pid, pid + P, ..."""
        bufs = gl.allocate_shared_memory(desc_x.dtype, [2 * NB] + desc_x.block_type.shape,
                                         desc_x.layout)
        ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for j in gl.static_range(2):
            mbarrier.init(ready.index(j), count=1)  # expect() is the producer's arrival
            mbarrier.init(empty.index(j), count=1)  # the consumer partition's arrival
        fence_async_shared()
        gl.warp_specialize([
            (_gn_apply, (desc_y, x_ptr, w_ptr, b_ptr, bufs, ready, empty, n_groups, CPG, G,
                         eps, HW, NB)),
            (_gn_load, (desc_x, bufs, ready, empty, n_groups, NB)),
        ], [1], [24])


def unsupported(x: torch.Tensor, cpg: int, hw: int) -> str | None:
    """Why the shared-memory form cannot run on x (None when it can)."""
    if gluon is None:
        return "the Gluon form needs triton.experimental.gluon (triton >= 3.5)"
    if interpreted() or x.device.type != "cuda":
        return "Gluon kernels run on a GPU only (the CPU interpreter does not run them)"
    major, minor = torch.cuda.get_device_capability(x.device)
    if major != 9:
        return f"the Gluon form is written for Hopper's TMA (sm_90); this GPU is sm_{major}{minor}"
    if x.dtype not in (torch.float16, torch.bfloat16):
        return f"the Gluon form takes float16 or bfloat16, got {x.dtype}"
    if x.numel() >= 2 ** 31:
        return "the Gluon form indexes rows in 32 bits: fewer than 2**31 elements"
    if hw % ROW or (cpg * hw) % BOX or cpg * hw > MAX_GROUP:
        return (f"the Gluon form needs H*W a multiple of {ROW} and a group of whole "
                f"{BOX}-element boxes, at most {MAX_GROUP}: got H*W={hw}, group {cpg * hw}")
    return None


def configs(cpg: int, hw: int) -> list[tuple[int, int, int, int, int]]:
    """(BLOCK = the group's L elements, num_warps, STAGES = 2 buffers, SPLIT = 0, SYNC = 2)
    candidates where a group is whole boxes and two of them fit shared memory."""
    L = cpg * hw
    if L % BOX or L > MAX_GROUP:
        return []
    return [(L, w, 2, 0, 2) for w in WARPS]


def check_config(cfg: tuple, cpg: int, hw: int) -> None:
    block, warps, stages, split, _ = cfg
    L = cpg * hw
    if block != L or split != 0 or stages != 2:
        raise ValueError(f"groupnorm_mish: SYNC=2 (the Gluon form) takes whole groups: BLOCK "
                         f"{L} (the group), STAGES 2, SPLIT 0; got {tuple(cfg)}")


def smem_launcher(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, y: torch.Tensor,
                  groups: int, num_groups: int, cpg: int, hw: int, eps: float, sms: int):
    """`launch(cfg)` for cfg (L, num_warps, 2, 0, 2): min(groups, SMs) persistent programs
    (one per SM: the launch divides the register file among its warps)."""
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    desc_x = GluonDescriptor.from_tensor(x.view(-1, ROW), [BOX_ROWS, ROW], layout)
    desc_y = GluonDescriptor.from_tensor(y.view(-1, ROW), [BOX_ROWS, ROW], layout)
    L = cpg * hw

    def launch(cfg):
        check_config(cfg, cpg, hw)
        _gn_mish_persistent[(min(groups, sms),)](
            desc_x, desc_y, x, w, b, groups, cpg, num_groups, eps, HW=hw, NB=L // BOX,
            num_warps=cfg[1])

    return launch
