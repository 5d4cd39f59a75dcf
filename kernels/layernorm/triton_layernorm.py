"""LayerNorm forward over the last dim of an (M, N) matrix in Triton, optionally fused with a
residual add (used by kernels/add_layernorm).

    h = x (+ residual)                 # optional: written out once, for the next residual branch
    y = (h - mean(h)) * rstd(h) * w + b,   rstd = 1 / sqrt(var(h) + eps)

Rows up to MAX_FUSED elements: a program normalises ROWS rows held entirely in registers
(a [ROWS, BLOCK_N] tile) — one read and one write of every element, the minimum traffic. A
width that is not a power of two is held as two power-of-two segments where that masks fewer
lanes (`segments`: 5120 = 4096 + 1024 rather than 8192 with 3072 masked; `_ln_tile3`). On an
H200 (run ...-layernorm-b6d0 against ...-0d42) 8192x5120 went 1.15x / 1.18x faster in fp16 /
bf16, 77 -> 88 % and 74 -> 87 % of a same-size copy, on one row of 4 warps: with 8 or 16
the tail's 4-element layout was taken for the whole tile and the sm_90 build moved the first
segment through shared memory (those configs took 70-96 us against 46). ROWS > 1
packs several short rows into one program so each still moves enough bytes. The statistics are
exact two-pass ones (mean, then the mean of squared deviations) computed from registers in fp32.
Either one program per row tile (`_ln_fwd_rows`, per_sm = 0), or `per_sm` programs per SM
walking the tiles (`_ln_fwd_persistent`) with the walk software-pipelined STAGES deep: on an
H200 the one-tile programs reached 74-85 % of copy bandwidth, long_scoreboard their top stall;
a persistent program has its next tiles' loads in flight while it reduces and stores one.

Longer rows: one program per row streams the row in BLOCK_N chunks twice (shifted sums, then
normalise); the second read mostly hits L2 because the row was just read by the same program.

(ROWS, num_warps, per_sm, STAGES) are picked by the Tuner per shape.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import Rule, Tuner, sm_count

MAX_FUSED = 16384  # longest row kept in registers by the one-pass kernel
LOOP_BLOCK = 4096  # chunk length of the long-row kernel
EPS = 1e-5

# candidates per shape (configs()); any power-of-two ROWS and num_warps launch; per_sm 0 is
# one program per row tile (then STAGES is 1), else programs per SM of the persistent kernel
_tuner = Tuner("layernorm_fwd", ("ROWS", "num_warps", "per_sm", "STAGES"),
               values={"ROWS": (1, 2, 4, 8, 16), "num_warps": (1, 2, 4, 8, 16),
                       "per_sm": (0, 1, 2, 4, 8), "STAGES": (1, 2, 3, 4)},
               rules=[Rule(("per_sm", "STAGES"), lambda p, s: p > 0 or s == 1,
                           "STAGES > 1 needs per_sm > 0 (a persistent program)")])
# persistent candidates added for the best (ROWS, num_warps): (per_sm, STAGES)
PERSISTENT = ((2, 3), (4, 2), (1, 4))
SMEM_BUDGET = 160 * 1024  # bytes per SM for the pipelined tiles (sm_90 has 228 KiB)


@triton.jit
def _ln_load(x_ptr, r_ptr, h_ptr, ro, cols, mask, x_stride, r_stride, h_stride,
             HAS_RES: tl.constexpr):
    """x (+ residual, h written) at rows `ro` and columns `cols` (broadcast to the tile's
    shape), in fp32. _ln_tile keeps these lines inline: called through here, its sm_90 build
    (the measured power-of-two kernels) came out different."""
    # read ROWS x len(cols) of x
    x = tl.load(x_ptr + ro * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        # read ROWS x len(cols) of residual
        x += tl.load(r_ptr + ro * r_stride + cols, mask=mask, other=0.0).to(tl.float32)
        # write ROWS x len(cols) of h = x + residual
        tl.store(h_ptr + ro * h_stride + cols, x.to(h_ptr.dtype.element_ty), mask=mask)
    return x


@triton.jit
def _ln_tile(x_ptr, r_ptr, h_ptr, y_ptr, mean_ptr, rstd_ptr, rows, cols, w, b,
             M, N, x_stride, r_stride, h_stride, y_stride, eps,
             HAS_RES: tl.constexpr, STORE_STATS: tl.constexpr):
    """Normalise the rows `rows` (a [ROWS] vector) held in registers; w, b: fp32 [BLOCK_N]."""
    row_ok = rows < M
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    r64 = rows.to(tl.int64)[:, None]
    # read ROWS x N of x
    x = tl.load(x_ptr + r64 * x_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        # read ROWS x N of residual
        r = tl.load(r_ptr + r64 * r_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        x = x + r
        # write ROWS x N of h = x + residual
        tl.store(h_ptr + r64 * h_stride + cols[None, :], x.to(h_ptr.dtype.element_ty), mask=mask)
    mean = tl.sum(x, axis=1) / N
    d = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(d * d, axis=1) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    y = d * rstd[:, None] * w[None, :] + b[None, :]
    # write ROWS x N of y
    tl.store(y_ptr + r64 * y_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    if STORE_STATS:
        # write ROWS floats of mean and of rstd (for the backward)
        tl.store(mean_ptr + rows, mean, mask=row_ok)
        tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def _ln_weights3(w_ptr, b_ptr, N, BLOCK_N: tl.constexpr, TAIL: tl.constexpr):
    """A row of two segments (`segments`) as 3-D tiles of one layout: the first BLOCK_N
    columns [1, BLOCK_N // TAIL, TAIL], the TAIL after them [1, 1, TAIL] (masked past N), and
    their w, b in fp32. (As [BLOCK_N] and [TAIL] vectors the two got different per-thread
    vector widths, and the sm_90 build converted the first segment's x and y through shared
    memory to the tail's narrower layout.)"""
    k = tl.arange(0, TAIL)
    cols = (tl.arange(0, BLOCK_N // TAIL)[:, None] * TAIL + k[None, :])[None, :, :]
    tcols = (BLOCK_N + k)[None, None, :]
    # read N of w and N of b (once per program; L2-resident across programs)
    w = tl.load(w_ptr + cols).to(tl.float32)
    b = tl.load(b_ptr + cols).to(tl.float32)
    tw = tl.load(w_ptr + tcols, mask=tcols < N, other=0.0).to(tl.float32)
    tb = tl.load(b_ptr + tcols, mask=tcols < N, other=0.0).to(tl.float32)
    return cols, w, b, tcols, tw, tb


@triton.jit
def _ln_tile3(x_ptr, r_ptr, h_ptr, y_ptr, mean_ptr, rstd_ptr, rows, cols, w, b, tcols, tw, tb,
              M, N, x_stride, r_stride, h_stride, y_stride, eps,
              HAS_RES: tl.constexpr, STORE_STATS: tl.constexpr):
    """_ln_tile for a row of two segments (_ln_weights3's tiles)."""
    row_ok = rows < M
    ok = row_ok[:, None, None]
    tmask = ok & (tcols < N)
    r3 = rows.to(tl.int64)[:, None, None]
    x = _ln_load(x_ptr, r_ptr, h_ptr, r3, cols, ok, x_stride, r_stride, h_stride, HAS_RES)
    xt = _ln_load(x_ptr, r_ptr, h_ptr, r3, tcols, tmask, x_stride, r_stride, h_stride,
                  HAS_RES)
    mean = (tl.sum(tl.sum(x, axis=2), axis=1) + tl.sum(tl.sum(xt, axis=2), axis=1)) / N
    d = x - mean[:, None, None]
    dt = tl.where(tmask, xt - mean[:, None, None], 0.0)
    var = (tl.sum(tl.sum(d * d, axis=2), axis=1) + tl.sum(tl.sum(dt * dt, axis=2), axis=1)) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    # write ROWS x N of y
    tl.store(y_ptr + r3 * y_stride + cols,
             (d * rstd[:, None, None] * w + b).to(y_ptr.dtype.element_ty), mask=ok)
    tl.store(y_ptr + r3 * y_stride + tcols,
             (dt * rstd[:, None, None] * tw + tb).to(y_ptr.dtype.element_ty), mask=tmask)
    if STORE_STATS:
        # write ROWS floats of mean and of rstd (for the backward)
        tl.store(mean_ptr + rows, mean, mask=row_ok)
        tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def _ln_weights(w_ptr, b_ptr, N, BLOCK_N: tl.constexpr, TAIL: tl.constexpr):
    """The row's columns and w, b in fp32: one [BLOCK_N] block (the tail's three are the
    same, unused), or with TAIL > 0 _ln_weights3's two segments."""
    if TAIL > 0:
        cols, w, b, tcols, tw, tb = _ln_weights3(w_ptr, b_ptr, N, BLOCK_N, TAIL)
    else:
        cols = tl.arange(0, BLOCK_N)
        # read N of w and N of b (once per program; L2-resident across programs)
        w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        tcols, tw, tb = cols, w, b
    return cols, w, b, tcols, tw, tb


@triton.jit
def _ln_rows(x_ptr, r_ptr, h_ptr, y_ptr, mean_ptr, rstd_ptr, rows, cols, w, b, tcols, tw, tb,
             M, N, x_stride, r_stride, h_stride, y_stride, eps,
             HAS_RES: tl.constexpr, STORE_STATS: tl.constexpr, TAIL: tl.constexpr):
    """_ln_tile, or _ln_tile3 for a row of two segments (_ln_weights's columns)."""
    if TAIL > 0:
        _ln_tile3(x_ptr, r_ptr, h_ptr, y_ptr, mean_ptr, rstd_ptr, rows, cols, w, b, tcols,
                  tw, tb, M, N, x_stride, r_stride, h_stride, y_stride, eps, HAS_RES,
                  STORE_STATS)
    else:
        _ln_tile(x_ptr, r_ptr, h_ptr, y_ptr, mean_ptr, rstd_ptr, rows, cols, w, b, M, N,
                 x_stride, r_stride, h_stride, y_stride, eps, HAS_RES, STORE_STATS)


@triton.jit
def _ln_fwd_rows(x_ptr, r_ptr, h_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr,
                 M, N, x_stride, r_stride, h_stride, y_stride, eps,
                 HAS_RES: tl.constexpr, STORE_STATS: tl.constexpr,
                 ROWS: tl.constexpr, BLOCK_N: tl.constexpr, TAIL: tl.constexpr):
    """One program per ROWS rows (TAIL > 0: of two segments, `segments`)."""
    cols, w, b, tcols, tw, tb = _ln_weights(w_ptr, b_ptr, N, BLOCK_N, TAIL)
    _ln_rows(x_ptr, r_ptr, h_ptr, y_ptr, mean_ptr, rstd_ptr,
             tl.program_id(0) * ROWS + tl.arange(0, ROWS), cols, w, b, tcols, tw, tb, M, N,
             x_stride, r_stride, h_stride, y_stride, eps, HAS_RES, STORE_STATS, TAIL)


@triton.jit
def _ln_fwd_persistent(x_ptr, r_ptr, h_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr,
                       M, N, x_stride, r_stride, h_stride, y_stride, eps,
                       HAS_RES: tl.constexpr, STORE_STATS: tl.constexpr,
                       ROWS: tl.constexpr, BLOCK_N: tl.constexpr, TAIL: tl.constexpr,
                       STAGES: tl.constexpr):
    """A few programs per SM, each walking row tiles pid, pid + programs, ...; the walk is
    software-pipelined STAGES deep (the next tiles' rows copied into shared memory while this
    one is reduced and stored). TAIL > 0: rows of two segments (`segments`)."""
    cols, w, b, tcols, tw, tb = _ln_weights(w_ptr, b_ptr, N, BLOCK_N, TAIL)
    for tile in tl.range(tl.program_id(0), tl.cdiv(M, ROWS), tl.num_programs(0),
                         num_stages=STAGES):
        _ln_rows(x_ptr, r_ptr, h_ptr, y_ptr, mean_ptr, rstd_ptr,
                 tile * ROWS + tl.arange(0, ROWS), cols, w, b, tcols, tw, tb, M, N, x_stride,
                 r_stride, h_stride, y_stride, eps, HAS_RES, STORE_STATS, TAIL)


@triton.jit
def _ln_fwd_looped(x_ptr, r_ptr, h_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr,
                   N, x_stride, r_stride, h_stride, y_stride, eps,
                   HAS_RES: tl.constexpr, STORE_STATS: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    r_row = r_ptr + row * r_stride
    h_row = h_ptr + row * h_stride
    # pass 1: shifted sums (shift = the row's first element keeps E[x^2] - E[x]^2 accurate)
    shift = tl.load(x_row).to(tl.float32)
    if HAS_RES:
        shift += tl.load(r_row).to(tl.float32)
    s1 = tl.zeros([BLOCK_N], tl.float32)
    s2 = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        # read N of x (first pass)
        v = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            # read N of residual ; write N of h
            v += tl.load(r_row + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(h_row + cols, v.to(h_ptr.dtype.element_ty), mask=mask)
        v = tl.where(mask, v - shift, 0.0)
        s1 += v
        s2 += v * v
    m1 = tl.sum(s1, axis=0) / N
    var = tl.maximum(tl.sum(s2, axis=0) / N - m1 * m1, 0.0)
    mean = shift + m1
    rstd = 1.0 / tl.sqrt(var + eps)
    # pass 2: normalise; the re-reads of x (and residual) come mostly from L2, and h is
    # recomputed in fp32 so that both kernels normalise the unrounded sum
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        # read N of x (second pass, L2) ; read N of w, b
        v = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            # read N of residual (second pass, L2)
            v += tl.load(r_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        # write N of y
        tl.store(y_ptr + row * y_stride + cols,
                 ((v - mean) * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    if STORE_STATS:
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)


def segments(N: int) -> tuple[int, int]:
    """(BLOCK_N, TAIL) of a row of N elements held in registers: one power-of-two block
    (TAIL 0), or, where that would mask more lanes, the largest power of two below N and the
    next power of two of the rest (5120 = 4096 + 1024: no masked lane where an 8192 block
    masks 3/8 of them, and with them 3/8 of a program's loads in flight)."""
    block = triton.next_power_of_2(N)
    tail = triton.next_power_of_2(N - block // 2) if block > N else block
    if block // 2 + tail >= block:
        return block, 0
    return block // 2, tail


def configs(M: int, N: int, itemsize: int, limit: int = 6,
            has_res: bool = False) -> list[tuple[int, int, int, int]]:
    """(ROWS, num_warps, per_sm, STAGES) candidates, best guess first (the interpreter uses
    the first untimed).

    One program per row tile (per_sm 0): programs of 2-32 KiB (ROWS = 1 always allowed) and
    1-4 16-byte vectors per thread, ranked by closeness to 16 KiB per program and 32 bytes per
    thread, at most `limit`; for a row of two segments, also one row on the most warps that
    give the tail whole 16-byte vectors; then the best as a persistent kernel with PERSISTENT's
    (per_sm, STAGES) where its pipelined tiles (STAGES - 1 buffers of x, and of the residual)
    fit SMEM_BUDGET per SM.
    """
    block = sum(segments(N))  # elements of a row tile in registers
    out = []
    for rows in (1, 2, 4, 8, 16):
        prog = rows * block * itemsize
        if rows > 1 and (rows > M or prog > 32768 or prog < 2048):
            continue
        for warps in (4, 8, 16, 2, 1):
            if 16 <= prog // (32 * warps) <= 64:
                out.append((rows, warps))
    if not out:  # tiny rows, or one row wider than 16 warps x 4 vectors: one row per program
        out.append((1, max(1, min(16, block * itemsize // (32 * 64)))))

    def score(c):
        rows, warps = c
        prog = rows * block * itemsize
        return abs(prog - 16384) / 16384 + abs(prog / (32 * warps) - 32) / 32

    best = sorted(out, key=score)[:limit]
    tail = segments(N)[1]
    # a row of two segments: one row on the most warps that still give the tail whole 16-byte
    # vectors (with more warps the sm_90 build takes the tail's narrower layout for the
    # whole tile, and the first segment's x and y go through shared memory to reach it)
    warps = min(16, tail * itemsize // (32 * 16))
    if warps and (1, warps) not in best and block * itemsize // (32 * warps) <= 128:
        best.append((1, warps))
    rows, warps = best[0]
    tile_bytes = rows * block * itemsize * (2 if has_res else 1)
    persistent = [(rows, warps, per_sm, stages) for per_sm, stages in PERSISTENT
                  if per_sm * (stages - 1) * tile_bytes <= SMEM_BUDGET]
    return [(r, w, 0, 1) for r, w in best] + persistent


def layernorm_fwd(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, *,
                  residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
                  h_out: torch.Tensor | None = None, stats: bool = False, eps: float = EPS,
                  config: tuple[int, int, int, int] | None = None):
    """LayerNorm of x (M, N) (plus `residual` (M, N) when given) with w, b (N,).

    Returns y (M, N); with `residual`, (h, y) where h = x + residual (M, N); with `stats`, the
    fp32 mean and rstd (M,) are appended. `config` forces (ROWS, num_warps, per_sm, STAGES) of
    the one-pass kernels.
    """
    if x.dim() != 2:
        raise ValueError(f"layernorm expects a 2-D input (M, N), got {tuple(x.shape)}")
    M, N = x.shape
    if w.shape != (N,) or b.shape != (N,):
        raise ValueError(f"weight and bias must have shape ({N},), got {tuple(w.shape)}, "
                         f"{tuple(b.shape)}")
    if x.stride(1) != 1:
        x = x.contiguous()
    w, b = w.contiguous(), b.contiguous()
    has_res = residual is not None
    if has_res:
        if residual.shape != x.shape:
            raise ValueError(f"residual shape {tuple(residual.shape)} != x {tuple(x.shape)}")
        if residual.stride(1) != 1:
            residual = residual.contiguous()
    y = torch.empty_like(x) if out is None else out
    h = (torch.empty_like(x) if h_out is None else h_out) if has_res else y
    r = residual if has_res else x
    if stats:
        mean = torch.empty(M, device=x.device, dtype=torch.float32)
        rstd = torch.empty(M, device=x.device, dtype=torch.float32)
    else:
        mean = rstd = y  # never touched (STORE_STATS is False)
    if M > 0 and N > 0:
        if N <= MAX_FUSED:
            block, tail = segments(N)

            def launch(cfg):
                rows, warps, per_sm, stages = cfg
                args = (x, r, h, y, w, b, mean, rstd, M, N, x.stride(0), r.stride(0),
                        h.stride(0), y.stride(0), eps)
                if per_sm == 0:
                    if stages != 1:
                        raise ValueError(f"config {cfg}: STAGES > 1 needs per_sm > 0")
                    _ln_fwd_rows[(triton.cdiv(M, rows),)](
                        *args, HAS_RES=has_res, STORE_STATS=stats, ROWS=rows, BLOCK_N=block,
                        TAIL=tail, num_warps=warps)
                else:
                    grid = min(sm_count(x.device) * per_sm, triton.cdiv(M, rows))
                    _ln_fwd_persistent[(grid,)](
                        *args, HAS_RES=has_res, STORE_STATS=stats, ROWS=rows, BLOCK_N=block,
                        TAIL=tail, STAGES=stages, num_warps=warps)

            if config is None:
                config = _tuner.pick(("rows", M, N, x.dtype, has_res, stats),
                                     configs(M, N, x.element_size(), has_res=has_res), launch)
            launch(config)
        else:
            _ln_fwd_looped[(M,)](x, r, h, y, w, b, mean, rstd, N, x.stride(0), r.stride(0),
                                 h.stride(0), y.stride(0), eps, HAS_RES=has_res,
                                 STORE_STATS=stats, BLOCK_N=LOOP_BLOCK, num_warps=8)
    result = (h, y) if has_res else (y,)
    if stats:
        result = result + (mean, rstd)
    return result if len(result) > 1 else result[0]
