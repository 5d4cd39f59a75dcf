"""GroupNorm + Mish with each program's tile of a group resident in shared memory, written in
Gluon (TMA copies, mbarriers): the Tuner's SYNC = 2 form.

Why: the one-kernel two-pass form reads a group twice (DRAM, then L2) and its programs wait on
both reads; on an H200 it stopped at 75-79 % of a same-size copy (runs ...-d71b, ...-558f: ncu
latency-bound, the first pass's load 30 % of the warp samples, DRAM 49 %, issue 64 %). Holding
x in registers instead (SYNC = 1) costs the registers that set occupancy. Shared memory holds
up to 227 KiB per SM: a whole 80 KiB group twice over.

STAGES programs per SM (1 to 4, as many as fit), persistent: program p takes tiles p, p + P,
... of T = L / S contiguous elements (tile t: group t // S, part t % S). A tile is NCH chunks
of CR rows x COLS columns of the (rows, COLS) view of x, CR = ROWS x num_warps (each thread
holds ROWS 16-byte vectors of a chunk), one TMA copy and one mbarrier per chunk, and one tile
slot. Per tile: shifted sums over its chunks as they land (shift = the group's first element);
for S > 1 the synchronised form's exchange (exchange.py: publish 2 partials as words of this
launch's epoch, poll the group's other S - 1, add the S in a fixed order); then normalise + Mish
chunk by chunk
from shared memory straight to y, and as soon as every warp holds chunk j in registers (a CTA
barrier, then a proxy fence) its slot is refilled with the next tile's chunk j. So DRAM sees
the next tile's reads beside this tile's writes, as in a copy, and no load waits in a thread's
registers.

On an H200 (runs ...-tune-groupnorm-mish-fc49 / ...-groupnorm-mish-d4bd, then ...-c3e3 /
...-6e2e): a first form with two slots per program (the next tile in flight in the other)
fitted one 80 KiB-tile program per SM and took 32.3 us at the 16x320x64x64 fp16 shape (the
two-pass form 29.3), 46 us at S = 2 (the exchange's latency, once per round, with nothing else
on the SM to hide it). With one slot (Tuner timings of ...-6e2e): two programs per SM, 28.6 us
there (two-pass 29.5); 26.9 us at 32x640x32x32 (four 40 KiB programs per SM; two-pass 29.2);
31.8 us at 4x320x128x128 (S = 4, two per SM; the synchronised register form 33.3). At batch 1
(32 groups) the register form stays ahead (12.2 us against 14.8). Taking the next tile's sums
inside the normalise loop, two chunks behind their refill (...-6ba4), lost 3-10 %: at the
64-register cap the accumulators spill, and the loop's mbarrier waits stall it.
More programs per SM on smaller tiles hide one program's waits behind the others' work (runs
...-96da, ...-f3bc, Tuner timings): at 128 groups four 8-warp programs on 40 KiB tiles (S = 8)
30.4 us against two 16-warp ones on 80 KiB (S = 4) 32.4; eight 4-warp programs on 20 KiB
tiles (S = 16) 28.7 against 30.7 and 32.2 in the same run; at 16x320x64x64 eight programs
(S = 4) 28.2 against 29.4 for two whole-group programs. At 32x640x32x32 four programs on whole
40 KiB groups stay ahead (26.9 against 29.1 for eight of S = 2). Two tile slots per program
(the next tile read while one is summed, waits and is normalised; 072bfb2, reverted; runs
...-tune-groupnorm-mish-slots-d41b, ...-groupnorm-mish-7d19) lost at every shape: at 128
groups fp16 the best two-slot build (S = 16, four 4-warp programs per SM) took 32.3 us
against 29.1 for eight one-slot programs on the same tiles, and 42.8 at S = 32 with eight per
SM; one-slot tiles of 2 chunks (S = 40) took 47.1: the fixed chain of every tile (shift load,
block sums, exchange) is what many small tiles pay. Nine and ten 4-warp programs per SM on the
eight-per-SM tiles (56 and 48 registers; c8780c9, reverted; runs
...-tune-groupnorm-mish-occupancy-90b3, ...-groupnorm-mish-44f5) ran at 0.92-0.96x and 0.83-0.87x
the speed of eight at the 80 MiB shapes (0.99-1.02x and 0.91-0.94x at batch 1): at nine, ncu
at 128 groups says compute-bound (SM 60 %), at ten the spills add 14 MB of traffic. The exchange itself was not
what the S > 1 tiles waited on: polling (value, epoch) words instead of counting in (runs
...-7532, ...-ac32) left every time within noise once one warp polled (every warp polling
its own copy had cost 9-12 % at 128 groups).

The wait needs a group's S tiles in flight together: P is a multiple of S, so the S tiles of a
group are taken by S programs in the same round, and an S > 1 launch is refused unless the
compiled kernel fits STAGES programs per SM (registers capped at the SM's share, `maxnreg`), so
all P programs are resident. Chunks never straddle channels (HW is a multiple of COLS: w and b
are per chunk row).

Limits: a Hopper-or-later GPU (TMA), triton >= 3.6, HW a multiple of COLS (256 16-bit or 128
fp32 elements), x 16-byte aligned (else the launcher falls back to the flat two-pass form).
Gluon kernels do not run in the CPU interpreter: CI builds this one for sm_90 ahead of time;
its numerics are checked on the GPU by the harness's check pass.
"""
from __future__ import annotations

import torch
import triton

from kernels._common import interpreted
from kernels.groupnorm_mish.candidates import smem_cols, smem_shape_error
from kernels.groupnorm_mish.exchange import _epoch, _gather, _publish, lanes
from kernels.groupnorm_mish.mish import _mish_affine, _stats

from kernels._gluon import MIN_TRITON, GluonDescriptor, fence_async_shared, gl, gluon, mbarrier
from kernels._gluon import cta_barrier as _cta_barrier
from kernels._gluon import tma_load as _tma_load
from kernels._gluon import triton_version as _triton_version

if gluon is not None:
    @gluon.jit
    def _gn_mish_smem(desc, x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, n_tiles, G, CPG,
                      eps, HW: gl.constexpr, S: gl.constexpr, K: gl.constexpr,
                      NCH: gl.constexpr, FAST: gl.constexpr):
        """desc: TMA descriptor of x's (rows, COLS) view in (CR, COLS) boxes; n_tiles = groups
        x S; a tile is NCH boxes."""
        CR: gl.constexpr = desc.block_type.shape[0]
        COLS: gl.constexpr = desc.block_type.shape[1]
        NBYTES: gl.constexpr = desc.block_type.nbytes
        nw: gl.constexpr = gl.num_warps()
        R: gl.constexpr = NCH * CR  # rows of a tile
        RPC: gl.constexpr = HW // COLS  # rows per channel
        layout: gl.constexpr = gl.BlockedLayout([1, COLS // 32], [1, 32], [nw, 1], [1, 0])
        flat: gl.constexpr = gl.BlockedLayout([1], [32], [nw], [0])
        buf = gl.allocate_shared_memory(desc.dtype, [NCH, CR, COLS], desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [NCH, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NCH):
            mbarrier.init(bars.index(i), count=1)
        fence_async_shared()
        pid = gl.program_id(0)
        P = gl.num_programs(0)
        L = CPG * HW
        rows = gl.arange(0, CR, layout=gl.SliceLayout(1, layout))
        offs = gl.expand_dims(rows, 1) * COLS + gl.expand_dims(
            gl.arange(0, COLS, layout=gl.SliceLayout(0, layout)), 0)
        # read the program's first tile (TMA, DRAM)
        for q in gl.static_range(NCH):
            mbarrier.expect(bars.index(q), NBYTES, pred=pid < n_tiles)
            _tma_load(desc, [pid * R + q * CR, 0], bars.index(q), buf.index(q),
                      pred=pid < n_tiles)
        phase = 0
        for t in range(pid, n_tiles, P):
            grp = t // S
            if S > 1:
                # read 1 word of the tile's partials (its last epoch: this launch's is one
                # above; exchange.py), used after the sums
                epoch = _epoch(part_ptr, t, 1)
            # read 1 element of x (the group's shift, shared by its S tiles)
            shift = gl.load(x_ptr + grp.to(gl.int64) * L).to(gl.float32)
            a1 = gl.zeros([CR, COLS], gl.float32, layout)
            a2 = gl.zeros([CR, COLS], gl.float32, layout)
            for j in range(NCH):  # each chunk as soon as it has landed
                mbarrier.wait(bars.index(j), phase)
                # read CR x COLS of x (shared memory)
                v = buf.index(j).load(layout).to(gl.float32) - shift
                a1 += v
                a2 += v * v
            s1 = gl.sum(gl.sum(a1, axis=1), axis=0)
            s2 = gl.sum(gl.sum(a2, axis=1), axis=0)
            if S > 1:
                # write the tile's 2 partials, read the group's other S - 1 from L2 as they
                # come, added in a fixed order
                _publish(part_ptr, t, s1, s2, epoch)
                s1, s2 = _gather(part_ptr, grp * S, t % S, gl.arange(0, K, layout=flat), S,
                                 s1, s2, epoch)
            mean, rstd = _stats(s1, s2, shift, L, eps)
            row0 = (t % S) * R  # the tile's first row within its group
            wc0 = (grp % G) * CPG
            ybase = y_ptr + t.to(gl.int64) * (R * COLS)
            nxt = t + P
            for j in range(NCH):
                # read CR x COLS of x (shared memory) into registers
                v = buf.index(j).load(layout).to(gl.float32)
                # every warp holds chunk j: refill its slot with the next tile's chunk j
                # (TMA, DRAM), in flight while this tile is normalised
                _cta_barrier()
                fence_async_shared()
                mbarrier.expect(bars.index(j), NBYTES, pred=nxt < n_tiles)
                _tma_load(desc, [nxt * R + j * CR, 0], bars.index(j), buf.index(j),
                          pred=nxt < n_tiles)
                c = wc0 + (row0 + j * CR + rows) // RPC
                # read CR of w and of b (L1/L2)
                gw = gl.load(w_ptr + c).to(gl.float32)
                gb = gl.load(b_ptr + c).to(gl.float32)
                # write CR x COLS of y
                gl.store(ybase + j * (CR * COLS) + offs,
                         _mish_affine(v - mean, rstd * gw, gb, FAST, y_ptr.dtype.element_ty))
            phase ^= 1


def unsupported(device: torch.device) -> str | None:
    """Why the shared-memory form cannot run on `device` (None when it can)."""
    if gluon is None or _triton_version() < MIN_TRITON:
        return (f"the shared-memory form (SYNC=2) needs triton >= "
                f"{'.'.join(map(str, MIN_TRITON))} (triton.experimental.gluon), got "
                f"{triton.__version__}")
    if interpreted() or device.type != "cuda":
        return ("the shared-memory form (SYNC=2) is a Gluon kernel: it runs on a GPU only "
                "(the CPU interpreter does not run it)")
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        return (f"the shared-memory form (SYNC=2) loads through TMA (sm_90 or later); this GPU "
                f"is sm_{major}{minor}")
    return None


def descriptor(rows: torch.Tensor, cr: int):
    """The TMA descriptor of x's (rows, COLS) view in boxes of `cr` rows, unswizzled (a warp
    reads a row: conflict-free)."""
    return GluonDescriptor.from_tensor(
        rows, [cr, rows.shape[1]],
        gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8 * rows.element_size(),
                             rank=2))


def launch_caps(warps: int, stages: int) -> dict:
    """Launch options: STAGES programs of `warps` warps share an SM's 64K registers, so the
    build is capped at its share (without it a synchronised build of 90 registers fits once
    per SM, and a group's programs could not all be resident)."""
    if stages == 1:
        return {}
    return {"maxnreg": min(255, 65536 // (32 * warps * stages) // 8 * 8)}


def kernel_consts(cfg: tuple, cpg: int, hw: int, itemsize: int) -> tuple[int, int, dict]:
    """(CR, COLS, the kernel's constexprs and launch options) of config (0, num_warps, STAGES,
    SPLIT, 2, ROWS) for groups of cpg x hw elements of `itemsize` bytes: what launch() passes
    and the sm_90 build check compiles."""
    _, warps, stages, split, _, rows = cfg
    c, cr = smem_cols(itemsize), rows * warps
    return cr, c, dict(HW=hw, S=split, K=lanes(split, warps),
                       NCH=cpg * hw // split // (cr * c), FAST=True, num_warps=warps,
                       **launch_caps(warps, stages))


_resident: dict = {}  # (device, compile key) -> programs of that build an SM holds


def resident_per_sm(device: torch.device, key: tuple, build) -> int:
    """How many programs of a build fit on one SM at once (shared memory, registers, warps),
    from the compiled kernel (`build()` compiles it without launching); kept per key."""
    k = (str(device), key)
    if k not in _resident:
        kernel = build()
        init = getattr(kernel, "_init_handles", None)
        if init is not None:
            init()
        warps = kernel.metadata.num_warps
        props = torch.cuda.get_device_properties(device)
        smem_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
        regs_sm = getattr(props, "regs_per_multiprocessor", 65536)
        threads_sm = getattr(props, "max_threads_per_multi_processor", 2048)
        regs_warp = -(-kernel.n_regs * 32 // 256) * 256  # allocated per warp in 256s
        _resident[k] = min(smem_sm // (kernel.metadata.shared + 1024),
                           regs_sm // (regs_warp * warps), threads_sm // (32 * warps))
    return _resident[k]


def launch(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, y: torch.Tensor, num_groups: int,
           eps: float, cfg: tuple, sms: int, words) -> None:
    """Run config (0, num_warps, STAGES, SPLIT, 2, ROWS) on contiguous, 16-byte-aligned x
    (N, C, H, W) into y. `words(split, groups)` gives the partials' words (exchange.py)."""
    N, C, H, W = x.shape
    cpg, hw = C // num_groups, H * W
    reason = unsupported(x.device) or smem_shape_error(tuple(cfg), cpg, hw, x.element_size())
    if reason:
        raise ValueError(f"groupnorm_mish: config {tuple(cfg)}: {reason}")
    _, warps, stages, split, _, _ = cfg
    cr, c, consts = kernel_consts(cfg, cpg, hw, x.element_size())
    groups = N * num_groups
    n_tiles = groups * split
    desc = descriptor(x.view(-1, c), cr)
    part = words(split, groups)
    args = (desc, x, w, b, y, part, n_tiles, num_groups, cpg, eps)
    fit = resident_per_sm(x.device, (x.dtype, *consts.items()),
                          lambda: _gn_mish_smem.warmup(*args, grid=(1,), **consts))
    if fit < 1 or (split > 1 and fit < stages):
        # a group's S programs wait for each other: all must be resident
        raise ValueError(f"groupnorm_mish: config {tuple(cfg)}: {stages} program(s) per SM "
                         f"asked, {fit} fit (shared memory, registers)")
    programs = min(n_tiles, sms * min(stages, fit))
    programs -= programs % split  # a group's tiles in one round
    _gn_mish_smem[(programs,)](*args, **consts)
