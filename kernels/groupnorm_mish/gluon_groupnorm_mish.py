"""GroupNorm + Mish with each program's share of a group held in shared memory, in Gluon
(Hopper: TMA copies in and out). The groupnorm_mish Tuner's `SYNC: 2`.

Why: the Triton forms either read x twice (one program per group: the second pass hits L2 only
in part, ncu 60 MB of DRAM reads for 42 MB of x at 512 groups) or hold a tile in registers
across the group's synchronisation (x read once, but registers cap the programs per SM at
23-50 % occupancy and each program loads, waits, computes and stores in turn: ncu at 512
groups DRAM 31-43 % and issue 42-52 % busy, neither saturated). Shared memory holds 4-20x more
of x per program than registers do, and TMA moves it without a register or an address
computation: a program asks for its whole share at once (8 KiB boxes, one mbarrier), so tens of
KiB per SM are in flight while the other resident programs compute.

One program owns T = NB boxes of 16 rows x 256 elements of one group (the group is one
contiguous run of L = (C/G)·H·W elements of NCHW, viewed as rows of 256; H·W a multiple of 256
keeps every row in one channel):
  1. TMA: its T elements of x into shared memory (DRAM, once);
  2. shifted sums of x - shift over them (shift: the group's first element, as the Triton
     forms; shared memory reads);
  3. S > 1 programs per group: publish the two partial sums, count in on the group's arrival
     counter and wait for the other S - 1 (the Triton SYNC 1 protocol: release/acquire atomics,
     counters never reset, partials added in a fixed order; a group's S <= SMs programs are
     adjacent in the grid, so they are resident together);
  4. y = mish((x - mean) rstd w + b) box by box, written over x's box in shared memory and sent
     out with a TMA store (DRAM, once).
Limits: sm_90, fp16/bf16, H·W a multiple of 256 and T a multiple of 4096; elsewhere the Tuner
offers the Triton forms only. Gluon kernels do not run in the CPU interpreter: CI builds this
one for sm_90 (tests/kernels/test_fused_ops.py) and tests the host side.
"""
from __future__ import annotations

import torch
import triton

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
MAX_TILE = 49152  # elements a program holds (96 KiB in 16-bit: two programs per SM)
MIN_TILE = 8192
WARPS = (8,)
MAX_CANDIDATES = 4


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
    def _gn_mish_smem(desc_x, desc_y, x_ptr, w_ptr, b_ptr, part_ptr, cnt_ptr, CPG, G, eps,
                      HW: gl.constexpr, S: gl.constexpr, NB: gl.constexpr,
                      S_P2: gl.constexpr, num_warps: gl.constexpr):
        """desc_x, desc_y: x, y as (numel / 256, 256) rows in 16 x 256 boxes; program
        group * S + t owns elements [t T, t T + T) of its group, T = NB boxes."""
        BR: gl.constexpr = desc_x.block_type.shape[0]
        R: gl.constexpr = desc_x.block_type.shape[1]
        T: gl.constexpr = NB * BR * R
        dtype: gl.constexpr = desc_x.dtype
        blk: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
        row_l: gl.constexpr = gl.SliceLayout(1, blk)
        flat: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        pid = gl.program_id(0)
        grp = pid // S
        t = pid % S
        L = CPG * HW
        row0 = (grp * L + t * T) // R
        tiles = gl.allocate_shared_memory(dtype, [NB, BR, R], desc_x.layout)
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        fence_async_shared()
        # read T elements of x (TMA, DRAM once)
        mbarrier.expect(bar, NB * desc_x.block_type.nbytes)
        for i in range(NB):
            _tma_load(desc_x, [row0 + i * BR, 0], bar, tiles.index(i))
        # read 1 element of x (the group's shift)
        shift = gl.load(x_ptr + grp.to(gl.int64) * L).to(gl.float32)
        mbarrier.wait(bar, 0)
        s1 = gl.zeros([BR, R], gl.float32, layout=blk)
        s2 = gl.zeros([BR, R], gl.float32, layout=blk)
        for i in range(NB):
            d = tiles.index(i).load(blk).to(gl.float32) - shift
            s1 += d
            s2 += d * d
        p1 = gl.sum(gl.sum(s1, axis=1), axis=0)
        p2 = gl.sum(gl.sum(s2, axis=1), axis=0)
        if S > 1:
            # write 2 floats (this program's partials), count in, wait for the group
            gl.store(part_ptr + 2 * pid, p1)
            gl.store(part_ptr + 2 * pid + 1, p2)
            arrived = gl.atomic_add(cnt_ptr + grp, 1, sem="release")
            target = arrived - arrived % S + S
            while gl.atomic_add(cnt_ptr + grp, 0, sem="acquire") < target:
                pass
            k = gl.arange(0, S_P2, layout=flat)
            # read the group's 2 x S partials (L2), in a fixed order
            ps = part_ptr + 2 * grp * S + 2 * k
            p1 = gl.sum(gl.load(ps, mask=k < S, other=0.0, cache_modifier=".cg"), axis=0)
            p2 = gl.sum(gl.load(ps + 1, mask=k < S, other=0.0, cache_modifier=".cg"), axis=0)
        m1 = p1 / L
        rstd = 1.0 / gl.sqrt(gl.maximum(p2 / L - m1 * m1, 0.0) + eps)
        r = gl.arange(0, BR, layout=row_l)
        for i in range(NB):
            c = (t * T + i * (BR * R) + r * R) // HW  # each row lies in one channel
            wc = (grp % G) * CPG + c
            # read BR of w and of b (L1/L2)
            a = rstd * gl.load(w_ptr + wc).to(gl.float32)
            bb = gl.load(b_ptr + wc).to(gl.float32) - m1 * a
            box = tiles.index(i)
            d = box.load(blk).to(gl.float32) - shift
            v = d * gl.expand_dims(a, 1) + gl.expand_dims(bb, 1)
            box.store(_mish(v).to(dtype))
            fence_async_shared()
            _cta_barrier()  # every thread's part of the box written before the copy
            # write BR x 256 of y (TMA, DRAM once)
            _tma_store(desc_y, [row0 + i * BR, 0], box)
        tma.store_wait(0)
        mbarrier.invalidate(bar)


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
    if hw % ROW or (cpg * hw) % BOX:
        return (f"the Gluon form needs H*W a multiple of {ROW} and a group a multiple of "
                f"{BOX} elements, got H*W={hw}, group {cpg * hw}")
    return None


def configs(cpg: int, hw: int, sms: int) -> list[tuple[int, int, int, int, int]]:
    """(BLOCK = T, num_warps, STAGES = 1, SPLIT = S, SYNC = 2) candidates: each way of cutting
    a group into S <= sms equal shares of MIN_TILE to MAX_TILE elements (whole boxes), the
    largest shares first, at most MAX_CANDIDATES."""
    L = cpg * hw
    out = []
    for s in range(1, min(sms, L // BOX) + 1):
        if L % s or (L // s) % BOX or not MIN_TILE <= L // s <= MAX_TILE:
            continue
        out += [(L // s, w, 1, s, 2) for w in WARPS]
    return out[:MAX_CANDIDATES]


def check_config(cfg: tuple, cpg: int, hw: int) -> None:
    block, warps, _, split, _ = cfg
    L = cpg * hw
    if block % BOX or block * split != L:
        raise ValueError(f"groupnorm_mish: SYNC=2 with SPLIT={split} needs BLOCK = the group's "
                         f"{L} elements / SPLIT, a multiple of {BOX}; got BLOCK={block}")


def smem_launcher(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, y: torch.Tensor,
                  groups: int, num_groups: int, cpg: int, hw: int, eps: float, counters):
    """`launch(cfg)` for cfg (T, num_warps, 1, S, 2); `counters(S)` gives the arrival counters
    for S programs per group (groupnorm_mish.arrival_counters)."""
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    desc_x = GluonDescriptor.from_tensor(x.view(-1, ROW), [BOX_ROWS, ROW], layout)
    desc_y = GluonDescriptor.from_tensor(y.view(-1, ROW), [BOX_ROWS, ROW], layout)

    def launch(cfg):
        check_config(cfg, cpg, hw)
        block, warps, _, split, _ = cfg
        part = torch.empty(2 * groups * split, device=x.device, dtype=torch.float32)
        cnt = counters(split) if split > 1 else part
        _gn_mish_smem[(groups * split,)](
            desc_x, desc_y, x, w, b, part, cnt, cpg, num_groups, eps, HW=hw, S=split,
            NB=block // BOX, S_P2=triton.next_power_of_2(split), num_warps=warps)

    return launch
