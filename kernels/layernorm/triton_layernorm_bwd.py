"""LayerNorm backward in Triton, and the autograd.Function that pairs it with the forward.

With xhat = (x - mean) * rstd and g = dy * w (rows of length N):

    dx = rstd * (g - mean_N(g) - xhat * mean_N(g * xhat))
    dw = sum_M(dy * xhat)          db = sum_M(dy)

Kernel 1 (`_ln_bwd_rows`): P programs (a small multiple of the SM count), each owning a
contiguous block of rows. A program keeps its rows' x and dy in registers, writes dx, and
accumulates dw/db partials for its rows in fp32 registers; at the end it writes one partial row
each (P x N fp32). The row loop is software-pipelined when STAGES > 1 (tl.range(num_stages=)):
the next STAGES - 1 row tiles of x and dy are copied into shared memory (cp.async) while the
current one is reduced, so a program has more than one row's loads in flight. Without it
(STAGES = 1, and what the kernel's own num_stages gives: Triton pipelines only loads that feed
a tl.dot) each iteration waits for its loads, then reduces, then stores. Kernel 2
(`_ln_bwd_colsum`) sums the P partial rows into dw, db — a deterministic two-stage reduction
(no atomics) — in column strips of about one per SM (`colsum_tiles`).

Traffic: read M·N of x and of dy, write M·N of dx (the minimum, 3·M·N·itemsize), plus the
M-float mean/rstd and 2·P·N fp32 partials written then read (P·N·16 bytes; ~4 % at N=4096,
M=16384, P=264).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels._common import Tuner, sm_count
from kernels.layernorm.triton_layernorm import EPS, SMEM_BUDGET, layernorm_fwd

MAX_BWD = 16384  # longest row the backward keeps in registers
# candidates per shape (configs()): (programs per SM, ROWS, num_warps, STAGES)
_tuner = Tuner("layernorm_bwd", ("per_sm", "ROWS", "num_warps", "STAGES"),
               values={"per_sm": (1, 2, 4, 6, 8), "ROWS": (1, 2, 4),
                       "num_warps": (1, 2, 4, 8, 16), "STAGES": tuple(range(1, 9))})


@triton.jit
def _add2(a1, b1, a2, b2):
    return a1 + a2, b1 + b2


@triton.jit
def _ln_bwd_rows(x_ptr, dy_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr, dwp_ptr, dbp_ptr,
                 M, N, x_stride, dy_stride, dx_stride, rows_per_prog,
                 ROWS: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
                 PDL: tl.constexpr):
    pid = tl.program_id(0)
    if PDL:  # the column-sum kernel may be scheduled now: its programs wait (gdc_wait) for
        # this kernel to finish, resident and launched, instead of launching after it
        gdc_launch_dependents()
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    # read N of w (once per program)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
    db_acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
    first = pid * rows_per_prog
    last = tl.minimum(first + rows_per_prog, M)
    for start in tl.range(first, last, ROWS, num_stages=STAGES):
        rows = start + tl.arange(0, ROWS)
        row_ok = rows < last
        mask = row_ok[:, None] & col_ok[None, :]
        r64 = rows.to(tl.int64)[:, None]
        # read ROWS x N of x and of dy (STAGES - 1 tiles ahead when pipelined) ;
        # read ROWS floats of mean and rstd
        x = tl.load(x_ptr + r64 * x_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + r64 * dy_stride + cols[None, :], mask=mask,
                     other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        g = dy * w[None, :]
        # both row sums in one reduction: one cross-warp exchange (shared memory + barrier)
        # per row tile instead of two (ncu at 16384 x 1024: the reductions' adds and barriers
        # were the top stalls, 47 % of the kernel's samples, and DRAM at 45 %)
        s1, s2 = tl.reduce((xhat * g, g), 1, _add2)
        c1 = s1 / N
        c2 = s2 / N
        dx = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
        # write ROWS x N of dx
        tl.store(dx_ptr + r64 * dx_stride + cols[None, :], dx.to(dx_ptr.dtype.element_ty),
                 mask=mask)
        dw_acc += dy * xhat
        db_acc += dy
    # write one N-float partial row of dw and of db
    tl.store(dwp_ptr + pid.to(tl.int64) * N + cols, tl.sum(dw_acc, axis=0), mask=col_ok)
    tl.store(dbp_ptr + pid.to(tl.int64) * N + cols, tl.sum(db_acc, axis=0), mask=col_ok)


@triton.jit
def _ln_bwd_colsum(dwp_ptr, dbp_ptr, dw_ptr, db_ptr, P, N,
                   BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < N
    dw = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
    db = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
    if PDL:  # launched early (programmatic dependent launch): wait until the rows kernel has
        # finished and its partials are visible
        gdc_wait()
    for p0 in range(0, P, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)
        mask = (rows < P)[:, None] & col_ok[None, :]
        offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
        # read P x BLOCK_C floats of each partial
        dw += tl.load(dwp_ptr + offs, mask=mask, other=0.0)
        db += tl.load(dbp_ptr + offs, mask=mask, other=0.0)
    # write BLOCK_C of dw and of db
    tl.store(dw_ptr + cols, tl.sum(dw, axis=0).to(dw_ptr.dtype.element_ty), mask=col_ok)
    tl.store(db_ptr + cols, tl.sum(db, axis=0).to(db_ptr.dtype.element_ty), mask=col_ok)


# (programs per SM, STAGES) tried with the best (ROWS, warps), then with the second best:
# unpipelined, and 2-3 stages (x and dy of the next rows in shared memory while one reduces)
# and deeper (2 x 4, 4 x 2-3: more bytes in flight per SM where the SM count of programs
# times 2-3 stages is not enough to cover DRAM latency)
PER_SM_STAGES = (((2, 1), (1, 1), (4, 1), (1, 3), (2, 2), (2, 3), (2, 4), (4, 2), (4, 3)),
                 ((2, 1), (1, 1), (4, 1), (2, 3), (2, 4), (4, 3)))

# for the one-or-two-warp row: more programs per SM (several rows in flight per SM), and
# deeper: at 16384 x 1024 its pick (4 per SM, 3 stages) left DRAM at 62 % with
# long_scoreboard the top stall (run ...-layernorm-bwd-0fe1): more bytes in flight (5 stages:
# 1.09x, DRAM 68 %, run ...-94b5)
PER_SM_SMALL = ((4, 1), (8, 1), (4, 3), (8, 2), (4, 5), (6, 4), (8, 3), (4, 7), (8, 4))


def colsum_tiles(P: int, N: int, sms: int) -> tuple[int, int]:
    """(BLOCK_P, BLOCK_C) of the column-sum kernel: column strips narrow enough that there is
    about one program per SM (8-64 columns: a strip row is at least one 32-byte sector), each
    taking up to 4096 partials per load, so the P partial rows come in one or two rounds.
    With 64-column strips (16 programs at N = 1024) it took 10.3 us of the backward's 49.5 at
    16384 x 1024 on an H200 (nsys, run ...-layernorm-bwd-6739): a few programs each walking
    P / 32 dependent rounds of loads."""
    c = N // max(1, sms)
    block_c = min(64, max(8, 1 << (c.bit_length() - 1) if c > 0 else 8))
    block_p = min(triton.next_power_of_2(max(1, P)), max(32, 4096 // block_c))
    return block_p, block_c


def configs(M: int, N: int, itemsize: int = 2) -> list[tuple[int, int, int, int]]:
    """(programs per SM, ROWS, num_warps, STAGES) candidates, best guess first (the
    interpreter uses the first untimed): the two (ROWS, warps) pairs closest to 8 fp32 values
    per thread per row-tile and ~8 KiB of x per iteration, with PER_SM_STAGES, and a row on one
    or two warps with PER_SM_SMALL; a pipelined candidate whose shared-memory buffers (x and
    dy: 2 x STAGES x ROWS x N) would take more than SMEM_BUDGET of an SM at its programs per
    SM is left out."""
    block = triton.next_power_of_2(N)
    tiles = []
    for rows in (1, 2, 4):
        if rows > 1 and (rows > M or block * rows * itemsize > 8192):
            continue
        for warps in (4, 8, 16):
            if 2 <= block * rows // (32 * warps) <= 32:
                tiles.append((rows, warps))
    if not tiles:
        tiles = [(1, max(1, min(16, block // 256)))]

    def score(t):
        rows, warps = t
        per_thread = block * rows / (32 * warps)
        return abs(per_thread - 8) / 8 + abs(block * rows * itemsize - 8192) / 8192

    best = sorted(tiles, key=score)[:2]
    # and a row on one or two warps (up to 32 values per thread): its two row sums need no
    # shared memory or barrier (one warp) or one small exchange (two), at the price of more
    # programs, so more dw/db partial rows written and summed (PER_SM_SMALL)
    small = [(1, w) for w in (1, 2) if block // (32 * w) <= 32 and (1, w) not in best][:1]
    pairs = PER_SM_STAGES + (PER_SM_SMALL,)
    return [(per_sm, rows, warps, stages) for (rows, warps), ps in zip(best + small, pairs)
            for per_sm, stages in ps
            if stages == 1 or per_sm * 2 * stages * rows * block * itemsize <= SMEM_BUDGET]


def layernorm_bwd(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, mean: torch.Tensor,
                  rstd: torch.Tensor, config: tuple[int, int, int, int] | None = None):
    """Gradients of LayerNorm: dy, x (M, N); w (N,); mean, rstd (M,) fp32 from the forward.

    Returns dx (M, N) in x's dtype and dw, db (N,) in w's dtype. `config` forces
    (programs per SM, ROWS, num_warps, STAGES).
    """
    M, N = x.shape
    if N > MAX_BWD:
        raise ValueError(f"Triton LayerNorm backward keeps a row in registers: N <= {MAX_BWD}, "
                         f"got {N}")
    if x.stride(1) != 1:
        x = x.contiguous()
    if dy.stride(1) != 1:
        dy = dy.contiguous()
    dx = torch.empty_like(x)
    dw = torch.empty_like(w)
    db = torch.empty_like(w)
    block = triton.next_power_of_2(N)
    sms = sm_count(x.device)  # in the interpreter a few: the partial reduction is exercised
    parts = {}
    # Hopper on: the column sum is a programmatic dependent launch (no launch gap between the
    # two kernels: at 16384 x 1024 on an H200 the rows kernel took 28.1 us, the column sum 2.7
    # us, the whole backward 32.5 us)
    pdl = x.is_cuda and torch.cuda.get_device_capability(x.device)[0] >= 9

    def launch(cfg):
        per_sm, rows, warps, stages = cfg
        progs = max(1, min(sms * per_sm, triton.cdiv(M, rows)))
        rpp = triton.cdiv(triton.cdiv(M, progs), rows) * rows  # whole ROWS tiles per program
        progs = triton.cdiv(M, rpp)
        if progs not in parts:
            parts[progs] = torch.empty((2, progs, N), device=x.device, dtype=torch.float32)
        dwp, dbp = parts[progs][0], parts[progs][1]
        _ln_bwd_rows[(progs,)](x, dy, w, mean, rstd, dx, dwp, dbp, M, N, x.stride(0),
                               dy.stride(0), dx.stride(0), rpp, ROWS=rows, BLOCK_N=block,
                               STAGES=stages, PDL=pdl, num_warps=warps)
        bp, bc = colsum_tiles(progs, N, sms)
        _ln_bwd_colsum[(triton.cdiv(N, bc),)](dwp, dbp, dw, db, progs, N, BLOCK_P=bp,
                                              BLOCK_C=bc, PDL=pdl, num_warps=4, launch_pdl=pdl)

    if config is None:
        config = _tuner.pick((M, N, x.dtype, sms), configs(M, N, x.element_size()), launch)
    launch(config)
    return dx, dw, db


class LayerNormFn(torch.autograd.Function):
    """y = LayerNorm(x; w, b) with the Triton forward (saving mean, rstd) and backward."""

    @staticmethod
    def forward(ctx, x, w, b, eps, bwd_config):
        y, mean, rstd = layernorm_fwd(x, w, b, stats=True, eps=eps)
        ctx.save_for_backward(x, w, mean, rstd)
        ctx.bwd_config = bwd_config
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = layernorm_bwd(dy, x, w, mean, rstd, config=ctx.bwd_config)
        return dx, dw, db, None, None


def layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None,
              eps: float = EPS, bwd_config: tuple[int, int, int, int] | None = None
              ) -> torch.Tensor:
    """LayerNorm of x (M, N) with w, b (N,) -> y (M, N).

    Differentiable (through LayerNormFn) when grad mode is on and an input requires grad;
    otherwise one forward kernel that writes into `out` and stores no statistics.
    `bwd_config` forces the backward's (programs per SM, ROWS, num_warps, STAGES).
    """
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, w, b)):
        if out is not None:
            raise ValueError("out= is not supported when the result needs a gradient")
        return LayerNormFn.apply(x, w, b, eps, bwd_config)
    return layernorm_fwd(x, w, b, out=out, eps=eps)
