"""groupnorm_mish's launch configurations: the tiles of a group, the chunks of the split form,
the synchronised form's tiles, the shared-memory form's rules, and the candidates the Tuner
times per shape (`configs`). Plain Python: the Triton kernels and their launcher are in
triton_groupnorm_mish.py, the Gluon kernel in smem_gluon.py."""
from __future__ import annotations

import triton

MAX_ONE_TILE = 16384  # elements of a group kept in registers by the one-pass variant
MAX_SPLIT = 64
# one-kernel two-pass candidates (BLOCK, num_warps, STAGES): unpipelined, and the tile loops
# pipelined 2-4 deep (STAGES - 1 tiles of BLOCK elements in shared memory per program)
TWO_PASS = ((4096, 8, 1), (8192, 16, 1), (4096, 8, 3), (8192, 16, 3), (2048, 4, 3),
            (4096, 4, 4), (2048, 4, 1), (8192, 8, 2))
# split-form chunk sizes tried (elements per program, about)
SPLIT_CHUNKS = (4096, 8192, 16384)
# the split form is a candidate below this many groups per SM: on an H200 (run
# ...-tune-groupnorm-mish-c12b) it lost to the one-kernel form by 1.25x or more at 512 groups
# (3.9 per SM) and tied it at 128 (1.0 per SM: 41.3 vs 41.7 us)
SPLIT_BELOW = 2
# synchronised-form tiles (BLOCK, num_warps): 32-64 elements of x per thread, held in
# registers across the wait. Fewer threads with more elements each: a program's fixed cost
# (two block reductions, the partials, the wait: ~250 instructions per thread) is spread over
# more elements (H200, first version: 4096 x 4 warps 32.7 us, 4096 x 8 warps 37.1 us)
SYNC_TILES = ((4096, 4), (8192, 4), (4096, 2), (8192, 8), (16384, 8))
# shared-memory form (SYNC = 2, smem_gluon.py): (num_warps, ROWS) of its chunks of ROWS x
# num_warps rows (ROWS 16-byte vectors per thread), in order of preference
SMEM_FORMS = ((16, 2), (8, 4), (16, 1), (8, 2), (4, 2))
SMEM_LIMIT = 232448  # bytes of shared memory a Hopper block may use (227 KiB)
SMEM_SM = 233472  # bytes of shared memory of a Hopper SM (each block also reserves 1 KiB)
SMEM_SLACK = 4096  # barriers and the block reductions' scratch
MAX_SMEM_PROGRAMS = 8  # programs per SM of the shared-memory form (STAGES)
MAX_BOX_ROWS = 256  # a TMA box's extent per dimension
MAX_CONFIGS = 28


def flat_cols(warps: int, itemsize: int) -> int:
    """COLS of the flat first pass (ROWS > 0): one 16-byte vector per thread."""
    return 32 * warps * (16 // itemsize)


def smem_cols(itemsize: int) -> int:
    """Columns of the shared-memory form's row view of x: one 16-byte vector per lane."""
    return 32 * (16 // itemsize)


def tile_smem(block: int, itemsize: int) -> int:
    """Shared memory of one shared-memory-form program: its tile, and slack."""
    return block * itemsize + SMEM_SLACK


def smem_shape_error(cfg: tuple, cpg: int, hw: int, itemsize: int) -> str | None:
    """Why config (BLOCK, num_warps, STAGES, SPLIT, 2, ROWS) of the shared-memory form does not
    fit a group of cpg x hw elements of `itemsize` bytes (None when it does). BLOCK 0: the
    tile is the group's L / SPLIT elements."""
    block, warps, stages, split, _, rows = cfg
    c, L = smem_cols(itemsize), cpg * hw
    if hw % c:
        return f"H*W={hw} is not a multiple of {c} (the row view's columns)"
    if split < 1 or L % split or block not in (0, L // split):
        return (f"SPLIT={split} must divide the group's {cpg}x{hw} = {L} elements (BLOCK 0 "
                f"or L / SPLIT), got BLOCK={block}")
    tile_elems, cr = L // split, rows * warps
    if rows < 1 or cr > MAX_BOX_ROWS or tile_elems % (cr * c):
        return (f"a tile of {tile_elems} elements is not whole chunks of ROWS={rows} x "
                f"num_warps={warps} rows of {c} (a TMA box has at most {MAX_BOX_ROWS} rows)")
    if not 1 <= stages <= MAX_SMEM_PROGRAMS or stages * warps > 32:
        return (f"STAGES (programs per SM) is 1 to {MAX_SMEM_PROGRAMS}, with STAGES x "
                f"num_warps <= 32, got STAGES={stages} num_warps={warps}")
    need = tile_smem(tile_elems, itemsize)
    if need > SMEM_LIMIT or stages * (need + 1024) > SMEM_SM:
        return (f"a tile of {tile_elems} elements needs {need} B of shared memory per program, "
                f"{stages} per SM: over the {SMEM_SM} B of an SM")
    return None


def smem_configs(cpg: int, hw: int, itemsize: int, sms: int) -> list[tuple]:
    """The shared-memory form's candidates. S = the fewest tiles per group (a power of two, at
    most the SMs) whose tile fits an SM; then the most programs per SM that fit (at most 2 of
    16 warps, 4 of 8), in the first SMEM_FORMS chunking that cuts the tile into whole chunks,
    and in the next one; one program per SM; 2S and 4S tiles (a half and a quarter the
    size: more programs per SM, so that one waiting for its group's partials leaves others
    to run); and the largest tiles of which eight 4-warp programs fit an SM."""
    def fitting(split: int, stages: int, warps: int) -> list[tuple]:
        return [cfg for cfg in ((0, w, stages, split, 2, r) for w, r in SMEM_FORMS if w == warps)
                if smem_shape_error(cfg, cpg, hw, itemsize) is None]

    def most(split: int) -> list[tuple]:
        for stages in range(4, 0, -1):  # 8 programs of 4 warps: the candidate below
            for warps in (16, 8):
                cands = fitting(split, stages, warps)
                if cands:
                    return cands
        return []

    limit, split = min(MAX_SPLIT, sms), 1
    while split <= limit and not most(split):
        split *= 2
    if split > limit:
        return []
    out = most(split)[:2]
    out += [c for c in fitting(split, 1, 16)[:1] if c not in out]
    for more in (2, 4):
        out += [c for c in (most(more * split)[:1] if more * split <= limit else [])
                if c not in out]
    # MAX_SMEM_PROGRAMS programs of 4 warps per SM, in the largest tiles that fit
    more = 1
    while more * split <= limit:
        eight = fitting(more * split, MAX_SMEM_PROGRAMS, 4)[:1]
        if eight:
            out += [c for c in eight if c not in out]
            break
        more *= 2
    return out


def chunks(cpg: int, split: int) -> tuple[int, int]:
    """(chunks, channels per chunk) of the split form asked for `split` chunks of a group of
    `cpg` channels: at most one per channel, balanced, none empty."""
    cpc = triton.cdiv(cpg, max(1, min(split, cpg)))
    return triton.cdiv(cpg, cpc), cpc


def tile(cpg: int, hw: int, block: int) -> tuple[int, int, bool]:
    """(CB, HB, ONE_TILE) for a tile budget of `block` elements over `cpg` channels."""
    hb = min(triton.next_power_of_2(hw), block)
    cb = max(1, block // hb)
    return cb, hb, (cb >= cpg and hb >= hw)


def sync_tiles(cpg: int, hw: int, block: int) -> tuple[int, int, int, int]:
    """(CB, HB, channel tiles, pixel tiles) of the synchronised form: one tile of up to
    `block` elements per program, S = channel tiles x pixel tiles programs per group."""
    cb, hb, _ = tile(cpg, hw, block)
    return cb, hb, triton.cdiv(cpg, cb), triton.cdiv(hw, hb)


def configs(cpg: int, hw: int, groups: int = 0, sms: int = 1,
            max_sync: int | None = None, smem_itemsize: int = 0
            ) -> list[tuple[int, int, int, int, int, int]]:
    """(BLOCK, num_warps, STAGES, SPLIT, SYNC, ROWS) candidates for `groups` groups on `sms`
    SMs; the first is the untimed default.

    One kernel: the one-tile configs where the group fits (nothing to pipeline), else up to 6
    two-pass ones, then the same with a flat first pass (ROWS 4; the unpipelined ones also
    ROWS 2). Synchronised form: the SYNC_TILES that cut the group into 2 to `max_sync`
    tiles (default min(MAX_SPLIT, sms): programs that must be resident together). Split form,
    only where the one-kernel form has fewer than SPLIT_BELOW programs per SM: chunks of whole
    channels of about SPLIT_CHUNKS elements, at least 2 per group, each in tiles of up to 8192
    elements (a chunk of several tiles also pipelined 2 deep; also with flat partials, ROWS 4).
    Shared-memory form (SYNC 2, where it runs: `smem_itemsize` the element size, else 0): up
    to 4 candidates (smem_configs), after the two-pass ones. At most MAX_CONFIGS in all."""
    one = triton.next_power_of_2(cpg) * triton.next_power_of_2(hw)
    out = []
    if one <= MAX_ONE_TILE:  # no loop: nothing to pipeline
        out += [(one, w, 1, 0, 0, 0) for w in (8, 16, 4) if 4 <= one // (32 * w) <= 64]
    two = [c for c in TWO_PASS if c[0] < one][:6]
    out += [(*c, 0, 0, 0) for c in two]
    # the same with a flat first pass: 4 vectors per thread per step (and 2 unpipelined)
    out += [(*c, 0, 0, 4) for c in two] + [(*c, 0, 0, 2) for c in two if c[2] == 1]
    if smem_itemsize and one > MAX_ONE_TILE:
        out += smem_configs(cpg, hw, smem_itemsize, sms)
    for block, warps in SYNC_TILES:
        _, _, nct, nht = sync_tiles(cpg, hw, block)
        if 2 <= nct * nht <= (max_sync or min(MAX_SPLIT, sms)):
            out.append((block, warps, 1, nct * nht, 1, 0))
    seen = set()
    for chunk in SPLIT_CHUNKS if groups < SPLIT_BELOW * sms else ():
        split, cpc = chunks(cpg, triton.cdiv(cpg, max(1, chunk // hw)))
        if split < 2 or split > MAX_SPLIT or split in seen:
            continue
        seen.add(split)
        elems = triton.next_power_of_2(cpc) * triton.next_power_of_2(hw)
        block = min(8192, elems)
        out.append((block, 8 if block >= 4096 else 4, 1, split, 0, 0))
        if elems > block:  # a chunk of several tiles: also pipelined
            out.append((block, 8, 2, split, 0, 0))
        # partials read flat (a chunk of whole channels is one contiguous run)
        out.append((block, 8 if block >= 4096 else 4, 1, split, 0, 4))
    return out[:MAX_CONFIGS] or [(one, 4, 1, 0, 0, 0)]
