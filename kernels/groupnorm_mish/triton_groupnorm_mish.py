"""GroupNorm (affine) followed by Mish, for NCHW activations, in Triton.

    x: (N, C, H, W), G groups of C/G channels; w, b: (C,)
    y = mish((x - mean_g) * rstd_g * w[c] + b[c]),   mish(v) = v * tanh(softplus(v))

In NCHW a group (n, g) is one contiguous run of L = (C/G)·H·W elements, walked as
[CB channels x HB pixels] tiles (no per-element channel division: w, b are loaded per channel
row of the tile). Four forms, all timed by the Tuner (`SPLIT` and `SYNC` fields; `ROWS`: a
flat first pass):

- SPLIT = 0, one kernel, one program per group:
  - ONE_TILE (the whole group fits one register tile, <= 16K elements): one read and one
    write of every element — the minimum.
  - otherwise two passes over the group: shifted sums (shift = the group's first element,
    which keeps E[x^2] - E[x]^2 accurate), then normalise + Mish. Each pass is one flat loop
    over the group's tiles, software-pipelined STAGES deep (tl.range(num_stages=)). The second
    pass walks the tiles in reverse so it starts with what the first pass read last: the
    re-read is served by L2, DRAM sees one read and one write.
  On an H200 this form reached 40-50 % of the DRAM roof at the SD U-Net shapes (ncu: SM 66 %,
  top stalls long_scoreboard and barrier, occupancy 40 %): each program walks 80-320 KiB
  alone, a few programs per SM, and there are only 128-512 groups.
  ROWS = R > 0 (`_flat_sums`): the first pass reads the group as one flat run (a group's
  statistics need no channels), R x COLS elements per step, COLS one 16-byte vector per
  thread: the R vectors of a thread come from one load, all in flight before any is added
  (the tile loop's SASS issues a tile's loads only after the previous tile's adds: 32 bytes
  per thread in flight). H200, runs ...-tune-groupnorm-mish-e11d, ...-groupnorm-mish-d71b and
  ...-558f: fp16 80 MiB shapes 28.9-29.6 us with ROWS 4 (30.1-31.0 without: 72 % -> 76-79 %
  of a same-size copy; +-4 % between H200s); ncu: the first pass's load still holds 30 % of
  the warp samples (long_scoreboard). The split form's partials read flat too.
- SPLIT = S >= 1 (SYNC = 0), two kernels, S programs per group, each owning a chunk of ceil(CPG / S)
  whole channels: `_gn_partials` writes each chunk's shifted sums (2 fp32, the group's
  shift shared by its chunks, so the partials add exactly), `_gn_apply` adds its group's S
  partials in a fixed order (deterministic, no atomics) and normalises its chunk. The second
  kernel takes the chunks in reverse launch order and its loads are marked evict_first while
  the first kernel's are evict_last, so that the re-read comes from L2 where the tensor (or
  its most recent part) fits; where it does not, DRAM sees 1.5x the minimum traffic, and the
  Tuner's timing of both forms (L2 flushed before every launch) says which one wins. On an
  H200 it lost at 512 groups (best split 41.0 us vs 32.8 us one-kernel) and tied at 128
  (41.3 vs 41.7 us), so it is a candidate only where the one-kernel form leaves SMs idle
  (fewer than SPLIT_BELOW groups per SM, e.g. batch 1: 32 groups on 132 SMs).

- SYNC = 1, one kernel, S programs per group synchronised inside it (S = the group's tiles
  of BLOCK elements; the SPLIT field holds S): each program loads its one tile into
  registers, publishes the tile's shifted sums and polls for the group's other S - 1
  (exchange.py: each partial one int64 word with its launch's epoch, so no counter or
  fence), then adds the S partials (a fixed order: deterministic) and normalises the tile it
  still holds. DRAM sees one read and one write whatever the size of the group, and every SM
  has programs to run at any batch. The wait needs a group's S programs resident together:
  blocks are dispatched in index order and a group's programs are adjacent, so S <= the SMs
  (each holds at least one program) cannot deadlock; launch() refuses larger S. The words
  (kept per device, stream and S) are never reset: a launch needs no memset and a CUDA-graph
  replay behaves like a launch. The CPU interpreter runs programs one after another (a wait
  would never end): there, S > 1 runs the kernel's two halves as two launches (PHASE 1
  publishes, PHASE 2 reloads and normalises).
  On an H200 (runs ...-groupnorm-mish-cb77 -> ae44 -> 4ae6) the Tuner picks it at 128 and 32
  groups (batch 1: 12.3-13.3 us where the split form took 17.9-18.1 us); at 512 and 1024
  groups the one-kernel form stays the pick (31-34 us; the best synchronised tile 33-34 us;
  ncu: x read once, 42 vs 60 MB, but neither DRAM nor the issue slots busy, occupancy 23-50 %
  set by registers; holding the tile as packed 16-bit pairs needed no fewer registers in an
  sm_90 build, the Mish stage's temporaries set the count).

- SYNC = 2 (smem_gluon.py, a Gluon kernel; Hopper): persistent programs, STAGES per SM, each
  holding a tile of L / SPLIT elements in shared memory (TMA copies, chunk by chunk), summing
  it, normalising it out of shared memory and refilling each chunk with its next tile's as it
  goes: x read once, reads and writes together. BLOCK is 0 (the tile is L / SPLIT). On an
  H200 (runs ...-groupnorm-mish-6e2e against ...-558f) the Tuner picked it at the 80 MiB
  shapes and at 128 groups (26.9-31.8 us, 3-9 % ahead of the other forms); with eight 4-warp
  programs per SM on 20 KiB tiles (run ...-f3bc) 28.7 us at 128 groups (two 16-warp
  programs: 32.2) and 28.2 at 16x320x64x64 fp16; where it cannot run (the CPU, pre-Hopper
  GPUs, H*W not a multiple of its 256 columns) it is not a candidate.

Tried on an H200 and not kept (runs ...-tune-groupnorm-mish-cbc0, ...-38fa/c42e): the
synchronised form as thread-block clusters (a group's S <= 16 programs one cluster, synchronised
by barrier.cluster instead of the arrival counters: 31.3-34.0 us at 80 MiB, the counters' form
31.6-32.6, so the synchronisation is not what that form waits on); the two-pass form as
persistent programs reading the next group's first pass in the loop that normalises the
current one (DRAM reads and writes together, as in a copy): 35-48 us, one step of lookahead
per program is too few bytes in flight; both passes' loads one step ahead in registers in the
one-kernel form (...-efc6, ...-6c32): within 1-3 % either way; the split form forced at 512
and 1024 groups (...-split-fc1e): 35.5 us at best (x re-read 1.21x the minimum).

Mish without tanh/log: with e = exp(v), tanh(log(1 + e)) = e(e + 2) / (e(e + 2) + 2), so
mish(v) = v · n / (n + 2), n = e(e + 2) (`_mish_affine`: for 16-bit outputs one ex2.approx.ftz
per element and one reciprocal per two elements). The element-wise work, not DRAM, set the pace
of the first synchronised version (ncu on an H200: issue slots 62-70 % busy at 30-55 % of DRAM
bandwidth): 27.8 SASS instructions per element at 32 elements per thread, 4 of them the denormal
fix-up around a non-ftz ex2 and 2 a select. Then 23.5 at 32 per thread and 20.2 at 64 (built for
sm_90 here: a program's fixed cost is ~250 instructions per thread); with `_mish_affine` the
two-pass form's second loop is 14.8 per element (was 16.2) and 1.5 MUFU ops (was 2): 1.04x geo-mean,
1.10x at batch 1 and no change at 512 groups (runs ...-3b05 -> ...-2700).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import Tuner, sm_count
from kernels.groupnorm_mish.candidates import (  # noqa: F401  (MAX_CONFIGS: re-exported)
    MAX_CONFIGS, MAX_SPLIT, chunks, configs, flat_cols, sync_tiles, tile)
from kernels.groupnorm_mish import exchange, smem_gluon
from kernels.groupnorm_mish.exchange import _epoch, _gather, _publish
from kernels.groupnorm_mish.mish import _mish_affine, _stats

# candidates per shape (configs()); BLOCK: any power of two up to MAX_ONE_TILE, or 0 (SYNC 2:
# the group's L / SPLIT)
_tuner = Tuner("groupnorm_mish", ("BLOCK", "num_warps", "STAGES", "SPLIT", "SYNC", "ROWS"),
               values={"BLOCK": (0,) + tuple(2 ** i for i in range(6, 15)),
                       "num_warps": (1, 2, 4, 8, 16), "STAGES": tuple(range(1, 9)),
                       "SPLIT": tuple(range(MAX_SPLIT + 1)), "SYNC": (0, 1, 2),
                       "ROWS": (0, 1, 2, 4, 8)})
# what a SYNC 2 pick runs on an x that is not 16-byte aligned (TMA cannot read it)
FALLBACK = (8192, 16, 1, 0, 0, 4)
_words: dict = {}  # (device, stream, S) -> the synchronised forms' partials (exchange.py)
last_kernels = 1  # kernels the last call launched (the check pass records it)


@triton.jit
def _chunk_sums(x_ptr, base, c0, c1, shift, HW: tl.constexpr, CB: tl.constexpr,
                HB: tl.constexpr, NHT: tl.constexpr, STAGES: tl.constexpr,
                EVICT: tl.constexpr):
    """Sums of (x - shift) and its square over channels [c0, c1) of the group at `base`."""
    cl = tl.arange(0, CB)
    hw = tl.arange(0, HB)
    # the tiles in one flat loop (t -> channel tile t // NHT, pixel tile t % NHT), an innermost
    # loop Triton can software-pipeline: with STAGES > 1 the next STAGES - 1 tiles are copied
    # into shared memory (cp.async) while one is reduced
    n_tiles = tl.cdiv(c1 - c0, CB) * NHT
    s1 = tl.zeros([CB, HB], tl.float32)
    s2 = tl.zeros([CB, HB], tl.float32)
    for t in tl.range(0, n_tiles, num_stages=STAGES):
        c = c0 + (t // NHT) * CB + cl
        h = (t % NHT) * HB + hw
        mask = (c < c1)[:, None] & (h < HW)[None, :]
        # read CB x HB of x (first pass, DRAM)
        v = tl.load(x_ptr + base + c[:, None] * HW + h[None, :], mask=mask, other=0.0,
                    eviction_policy=EVICT).to(tl.float32)
        v = tl.where(mask, v - shift, 0.0)
        s1 += v
        s2 += v * v
    return tl.sum(tl.sum(s1, axis=1), axis=0), tl.sum(tl.sum(s2, axis=1), axis=0)


@triton.jit
def _flat_sums(x_ptr, base, L, x0, ROWS: tl.constexpr, COLS: tl.constexpr,
               EVICT: tl.constexpr):
    """Sums of (x - x0) and its square over the L contiguous elements at `base` (a whole
    group, or a chunk of whole channels: the statistics need no channels told apart), ROWS x
    COLS per step.

    COLS = one 16-byte vector per thread: the ROWS vectors of a thread are loaded by one
    load (ROWS x 16 bytes in flight per thread before any is used: ptxas does not hoist the
    loads of a second tile above the adds of the first), then added across rows within the
    thread; the accumulators stay COLS wide whatever ROWS is."""
    r = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    shift = x0.to(tl.float32)
    s1 = tl.zeros([COLS], tl.float32)
    s2 = tl.zeros([COLS], tl.float32)
    for i in range(0, tl.cdiv(L, ROWS * COLS)):
        o = i * (ROWS * COLS) + r
        # read ROWS x COLS of x (first pass, DRAM); past the end read as x0: adds 0
        v = tl.load(x_ptr + base + o, mask=o < L, other=x0,
                    eviction_policy=EVICT).to(tl.float32) - shift
        s1 += tl.sum(v, axis=0)
        s2 += tl.sum(v * v, axis=0)
    return tl.sum(s1, axis=0), tl.sum(s2, axis=0)


@triton.jit
def _chunk_apply(x_ptr, w_ptr, b_ptr, y_ptr, base, wc, c0, c1, mean, rstd,
                 HW: tl.constexpr, CB: tl.constexpr, HB: tl.constexpr, NHT: tl.constexpr,
                 STAGES: tl.constexpr, FAST: tl.constexpr, EVICT: tl.constexpr):
    """y = mish((x - mean) * rstd * w + b) over channels [c0, c1) of the group at `base`
    (`wc`: the group's first channel in w, b); tiles in reverse, most recently read first."""
    cl = tl.arange(0, CB)
    hw = tl.arange(0, HB)
    n_tiles = tl.cdiv(c1 - c0, CB) * NHT
    for t in tl.range(0, n_tiles, num_stages=STAGES):
        tr = n_tiles - 1 - t
        c = c0 + (tr // NHT) * CB + cl
        h = (tr % NHT) * HB + hw
        c_ok = c < c1
        mask = c_ok[:, None] & (h < HW)[None, :]
        # read CB of w and of b (L1/L2)
        gw = tl.load(w_ptr + wc + c, mask=c_ok, other=0.0).to(tl.float32)
        gb = tl.load(b_ptr + wc + c, mask=c_ok, other=0.0).to(tl.float32)
        offs = base + c[:, None] * HW + h[None, :]
        # read CB x HB of x (second pass, mostly L2) ; write CB x HB of y
        v = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
        # (x - mean) first: folding mean into the bias would cancel badly when |mean| >> std
        # (a constant group: x - mean is exactly 0, x·a - mean·a is mean·a's rounding)
        tl.store(y_ptr + offs, _mish_affine(v - mean, rstd * gw, gb, FAST, y_ptr.dtype.element_ty),
                 mask=mask)


@triton.jit
def _gn_mish(x_ptr, w_ptr, b_ptr, y_ptr, CPG, G, eps,
             HW: tl.constexpr, CB: tl.constexpr, HB: tl.constexpr, NHT: tl.constexpr,
             ONE_TILE: tl.constexpr, STAGES: tl.constexpr, FAST: tl.constexpr,
             ROWS: tl.constexpr = 0, COLS: tl.constexpr = 0):
    pid = tl.program_id(0)  # group index n * G + g
    g = pid % G
    base = pid.to(tl.int64) * CPG * HW  # (n*C + g*CPG) * HW
    L = CPG * HW
    if ONE_TILE:
        cl = tl.arange(0, CB)
        hw = tl.arange(0, HB)
        mask = (cl < CPG)[:, None] & (hw < HW)[None, :]
        offs = base + cl[:, None] * HW + hw[None, :]
        # read L elements of x (the whole group, kept in registers)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(tl.sum(x, axis=1), axis=0) / L
        d = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(tl.sum(d * d, axis=1), axis=0) / L + eps)
        # read CPG of w and of b
        gw = tl.load(w_ptr + g * CPG + cl, mask=cl < CPG, other=0.0).to(tl.float32)
        gb = tl.load(b_ptr + g * CPG + cl, mask=cl < CPG, other=0.0).to(tl.float32)
        # write L elements of y
        tl.store(y_ptr + offs, _mish_affine(d, rstd * gw, gb, FAST, y_ptr.dtype.element_ty),
                 mask=mask)
    else:
        x0 = tl.load(x_ptr + base)
        shift = x0.to(tl.float32)
        if ROWS:
            s1, s2 = _flat_sums(x_ptr, base, L, x0, ROWS, COLS, "")
        else:
            s1, s2 = _chunk_sums(x_ptr, base, 0, CPG, shift, HW, CB, HB, NHT, STAGES, "")
        mean, rstd = _stats(s1, s2, shift, L, eps)
        _chunk_apply(x_ptr, w_ptr, b_ptr, y_ptr, base, g * CPG, 0, CPG, mean, rstd, HW, CB, HB,
                     NHT, STAGES, FAST, "")


@triton.jit
def _gn_partials(x_ptr, part_ptr, CPG, CPC, HW: tl.constexpr, CB: tl.constexpr,
                 HB: tl.constexpr, NHT: tl.constexpr, SPLIT: tl.constexpr,
                 STAGES: tl.constexpr, ROWS: tl.constexpr = 0, COLS: tl.constexpr = 0):
    pid = tl.program_id(0)  # group * SPLIT + chunk
    grp = pid // SPLIT
    c0 = (pid % SPLIT) * CPC
    base = grp.to(tl.int64) * CPG * HW
    # read 1 element of x (the group's shift; every chunk of the group uses the same)
    x0 = tl.load(x_ptr + base)
    c1 = tl.minimum(c0 + CPC, CPG)
    # read the chunk of x (DRAM; kept in L2 for the apply kernel where it fits): whole
    # channels, so one contiguous run, read flat where ROWS > 0
    if ROWS:
        s1, s2 = _flat_sums(x_ptr, base + c0 * HW, (c1 - c0) * HW, x0, ROWS, COLS,
                            "evict_last")
    else:
        s1, s2 = _chunk_sums(x_ptr, base, c0, c1, x0.to(tl.float32), HW, CB, HB, NHT, STAGES,
                             "evict_last")
    # write 2 floats
    tl.store(part_ptr + 2 * pid, s1)
    tl.store(part_ptr + 2 * pid + 1, s2)


@triton.jit
def _gn_apply(x_ptr, w_ptr, b_ptr, part_ptr, y_ptr, CPG, CPC, G, eps,
              HW: tl.constexpr, CB: tl.constexpr, HB: tl.constexpr, NHT: tl.constexpr,
              SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr, STAGES: tl.constexpr,
              FAST: tl.constexpr):
    # reverse launch order: the chunks the partials kernel read last (still in L2) go first
    q = tl.num_programs(0) - 1 - tl.program_id(0)
    grp = q // SPLIT
    c0 = (q % SPLIT) * CPC
    base = grp.to(tl.int64) * CPG * HW
    k = tl.arange(0, SPLIT_P2)
    # read the group's 2 x SPLIT partial sums (added in a fixed order: deterministic)
    ps = part_ptr + 2 * grp * SPLIT + 2 * k
    s1 = tl.sum(tl.load(ps, mask=k < SPLIT, other=0.0), axis=0)
    s2 = tl.sum(tl.load(ps + 1, mask=k < SPLIT, other=0.0), axis=0)
    # read 1 element of x (the shift the partials were taken around)
    shift = tl.load(x_ptr + base).to(tl.float32)
    mean, rstd = _stats(s1, s2, shift, CPG * HW, eps)
    _chunk_apply(x_ptr, w_ptr, b_ptr, y_ptr, base, (grp % G) * CPG, c0,
                 tl.minimum(c0 + CPC, CPG), mean, rstd, HW, CB, HB, NHT, STAGES, FAST,
                 "evict_first")


@triton.jit
def _gn_mish_sync(x_ptr, w_ptr, b_ptr, y_ptr, part_ptr, CPG, G, eps,
                  HW: tl.constexpr, CB: tl.constexpr, HB: tl.constexpr, NCT: tl.constexpr,
                  NHT: tl.constexpr, K: tl.constexpr, PHASE: tl.constexpr,
                  FAST: tl.constexpr):
    """K: exchange.lanes(S, num_warps), the length of exchange._gather's lane vector."""
    S: tl.constexpr = NCT * NHT  # programs (tiles) per group
    pid = tl.program_id(0)  # group * S + tile
    grp = pid // S
    t = pid % S
    base = grp.to(tl.int64) * CPG * HW
    c = (t // NHT) * CB + tl.arange(0, CB)
    h = (t % NHT) * HB + tl.arange(0, HB)
    c_ok = c < CPG
    mask = c_ok[:, None] & (h < HW)[None, :]
    offs = base + c[:, None] * HW + h[None, :]
    # read 1 word of this tile's partials (its last epoch: this launch's is one above;
    # the interpreter's second half reads the one its first half wrote)
    epoch = _epoch(part_ptr, pid, 1 if PHASE != 2 else 0)
    # read 1 element of x (the group's shift, shared by its S tiles so the partials add)
    x0 = tl.load(x_ptr + base).to(tl.float32)
    # read CB x HB of x (DRAM, once: kept in registers, shifted, until the group's statistics
    # are in); masked elements add 0. (Read as the shift, they needed no select, but every
    # load then waited for the shift's: a DRAM round trip before the first byte of the tile)
    d = tl.where(mask, tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32) - x0, 0.0)
    s1 = 0.0
    s2 = 0.0
    me = -1  # PHASE 2 reads its own partials back too
    if PHASE != 2:
        # write this tile's 2 partials (words of this launch's epoch)
        s1 = tl.sum(tl.sum(d, axis=1), axis=0)
        s2 = tl.sum(tl.sum(d * d, axis=1), axis=0)
        _publish(part_ptr, pid, s1, s2, epoch)
        me = t
    if PHASE != 1:
        # read the group's other S - 1 partials from L2 as they come (exchange.py), added in
        # a fixed order (deterministic)
        s1, s2 = _gather(part_ptr, grp * S, me, tl.arange(0, K), S, s1, s2, epoch)
        # the mean relative to the shift, and rstd
        m1, rstd = _stats(s1, s2, 0.0, CPG * HW, eps)
        wc = (grp % G) * CPG + c
        # read CB of w and of b (L1/L2)
        a = rstd * tl.load(w_ptr + wc, mask=c_ok, other=0.0).to(tl.float32)
        gb = tl.load(b_ptr + wc, mask=c_ok, other=0.0).to(tl.float32)
        # (x - mean) a + b = d a + (b - m1 a): one FMA per element, no cancellation (d and m1
        # are both relative to the shift, an element of the group)
        # write CB x HB of y
        tl.store(y_ptr + offs, _mish_affine(d, a, gb - m1 * a, FAST, y_ptr.dtype.element_ty),
                 mask=mask)


def exchange_words(device: torch.device, split: int, groups: int) -> torch.Tensor:
    """The synchronised forms' partials' words (int64, two per tile: exchange.py) for `groups`
    groups of `split` programs on `device` and its current stream: kept between calls (every
    launch moves each word of its groups one epoch on), zeros when new or grown."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream, split)
    words = _words.get(key)
    if words is None or words.numel() < 2 * groups * split:
        # a launch still queued on the old buffer keeps it alive (stream-ordered allocator)
        words = _words[key] = torch.zeros(2 * triton.next_power_of_2(groups) * split,
                                          device=device, dtype=torch.int64)
    return words


def kernels_launched() -> int:
    """Kernels the last groupnorm_mish call launched: 1, or 2 in the split form (and in the
    CPU interpreter's synchronised form, run as two halves)."""
    return last_kernels


def groupnorm_mish(x: torch.Tensor, num_groups: int, w: torch.Tensor, b: torch.Tensor,
                   eps: float = 1e-5, out: torch.Tensor | None = None,
                   config: tuple[int, ...] | None = None) -> torch.Tensor:
    """mish(GroupNorm(x)) for x (N, C, H, W) contiguous, w, b (C,); returns y (N, C, H, W).

    `config` forces (BLOCK, num_warps, STAGES, SPLIT, SYNC, ROWS) instead of the tuned
    choice; a 3-tuple means SPLIT 0 (one program per group), a 4-tuple SYNC 0, a 5-tuple
    ROWS 0 (the first pass in tiles). SYNC 2 (the shared-memory form) on an x that is not
    16-byte aligned (a view at an odd offset: TMA cannot read it) runs FALLBACK instead.
    """
    global last_kernels
    if x.dim() != 4:
        raise ValueError(f"expected x of shape (N, C, H, W), got {tuple(x.shape)}")
    N, C, H, W = x.shape
    if C % num_groups != 0:
        raise ValueError(f"C={C} is not divisible by num_groups={num_groups}")
    if w.shape != (C,) or b.shape != (C,):
        raise ValueError(f"weight and bias must have shape ({C},)")
    x = x.contiguous()
    w, b = w.contiguous(), b.contiguous()
    y = torch.empty_like(x) if out is None else out
    cpg, hw = C // num_groups, H * W
    if x.numel() == 0:
        return y
    fast = x.is_cuda
    groups = N * num_groups
    # the synchronised form's programs per group that can be resident together (GPU; the
    # interpreter's two halves need no residency)
    resident = min(MAX_SPLIT, sm_count(x.device)) if fast else None

    def launch(cfg) -> int:
        vals = tuple(cfg)
        block, warps, stages, split, sync, rows = vals + (0, 0, 0)[len(vals) - 3:]
        if sync == 2:
            if x.data_ptr() % 16:  # TMA needs a 16-byte-aligned x: the flat two-pass form
                return launch(FALLBACK)
            smem_gluon.launch(x, w, b, y, num_groups, eps, vals, sm_count(x.device),
                              lambda s, g: exchange_words(x.device, s, g))
            return 1
        if sync:
            cb, hb, nct, nht = sync_tiles(cpg, hw, block)
            if split != nct * nht:
                raise ValueError(f"groupnorm_mish: SYNC=1 with BLOCK={block} cuts a group of "
                                 f"{cpg}x{hw} into {nct * nht} tiles: SPLIT must be "
                                 f"{nct * nht}, not {split}")
            if resident and split > resident:
                raise ValueError(f"groupnorm_mish: SYNC=1 needs the group's {split} programs "
                                 f"resident together: at most {resident} here (a larger BLOCK)")
            part = exchange_words(x.device, split, groups)
            phases = (0,) if fast or split == 1 else (1, 2)
            k = exchange.lanes(split, warps)
            for phase in phases:
                _gn_mish_sync[(groups * split,)](
                    x, w, b, y, part, cpg, num_groups, eps, HW=hw, CB=cb, HB=hb, NCT=nct,
                    NHT=nht, K=k, PHASE=phase, FAST=fast, num_warps=warps)
            return len(phases)
        if split == 0:
            cb, hb, one = tile(cpg, hw, block)
            _gn_mish[(groups,)](x, w, b, y, cpg, num_groups, eps, HW=hw, CB=cb, HB=hb,
                                NHT=triton.cdiv(hw, hb), ONE_TILE=one, STAGES=stages,
                                FAST=fast, ROWS=rows, COLS=flat_cols(warps, x.element_size()),
                                num_warps=warps)
            return 1
        split, cpc = chunks(cpg, split)
        cb, hb, _ = tile(cpc, hw, block)
        nht = triton.cdiv(hw, hb)
        part = torch.empty(2 * groups * split, device=x.device, dtype=torch.float32)
        _gn_partials[(groups * split,)](x, part, cpg, cpc, HW=hw, CB=cb, HB=hb, NHT=nht,
                                        SPLIT=split, STAGES=stages, ROWS=rows,
                                        COLS=flat_cols(warps, x.element_size()),
                                        num_warps=warps)
        _gn_apply[(groups * split,)](x, w, b, part, y, cpg, cpc, num_groups, eps, HW=hw, CB=cb,
                                     HB=hb, NHT=nht, SPLIT=split,
                                     SPLIT_P2=triton.next_power_of_2(split), STAGES=stages,
                                     FAST=fast, num_warps=warps)
        return 2

    if config is None:
        smem = x.element_size() if smem_gluon.unsupported(x.device) is None else 0
        config = _tuner.pick((N, C, hw, num_groups, x.dtype),
                             configs(cpg, hw, groups, sm_count(x.device), resident or MAX_SPLIT,
                                     smem), launch)
    last_kernels = launch(config)
    return y
