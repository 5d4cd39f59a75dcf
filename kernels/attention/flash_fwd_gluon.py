"""FlashAttention forward for Hopper written in Gluon (triton.experimental.gluon), in the form
of FlashAttention-3: explicit asynchronous wgmma, a TMA producer warp, two or three consumer
warpgroups.

Why a third form: the TMA kernel (flash_fwd_tma.py) stalled at 0.73-0.89x cuDNN at D=128 on an
H200. Its profile said latency-bound (tensor pipe ~50 %); the FA3 remedies need control that
Triton's language does not give: Triton keeps a wgmma in flight only along a loop-carried
accumulator chain, so a score tile's exponentials cannot run while the tensor cores work on
the next tile (see flash_fwd_tma.py). Gluon exposes the hardware's pieces: `warpgroup_mma(...,
is_async=True)` / `warpgroup_mma_wait(n)`, mbarriers, TMA copies, warp specialization with
per-partition register budgets.

Structure of one program (BLOCK_M = 128 or 192 query rows of one head, grid (cdiv(N, BLOCK_M),
B*H)):
- a 1-warp producer partition (24 registers) issues the TMA copies: Q once (64-row parts),
  then K and V tiles of BLOCK_N rows into STAGES-deep rings, each slot with a ready mbarrier
  (the copy's transaction count) and an empty one (every consumer released it);
- two 4-warp consumer partitions (240 registers each) or, at BLOCK_M 192, three (160 each:
  FlashAttention-3's D=64 tile), one per 64-row part of the query tile, each issuing its own
  wgmmas (a Hopper accumulator lives in the issuing warpgroup's registers) and running its own
  online softmax (base 2, as flash_fwd.py);
- OVERLAP (FA3's intra-warpgroup pipelining): iteration j issues S_j = Q K_j^T and then
  O += P_{j-1} V_{j-1}, waits for S_j only (`warpgroup_mma_wait(1)`), and computes the
  softmax of S_j while the P V product is still on the tensor cores;
- PINGPONG (FA3's inter-warpgroup schedule, off by default): a pair of mbarriers hands the
  right to issue wgmmas from one consumer to the other each iteration, so one warpgroup's
  softmax runs while the other's matrix products do.
First light on an H200 (tools/device/gluon_fwd_check.py --quick: B=4 H=16 N=4096 fp16, TFLOP/s,
L2-flushed medians): D=128 non-causal, BLOCK_N 128, 2 stages: 610 plain, 669 with OVERLAP, 605
with PINGPONG, 662 with both (cuDNN 654, the TMA kernel 523); causal 535 / 574 / 533 / 576
(cuDNN 570); D=64 non-causal 425 / 445 / 426 / 433 (cuDNN 480). So OVERLAP is on and PINGPONG
off: with two consumers already interleaving on their own, the hand-over only adds waits.
D=64 (one H100, tools/device/gluon_fwd_check.py --dims 64 --default, fp16, TFLOP/s): at D=64 a
key tile's exponentials take about as long as its two matrix products, and two warpgroups left
the SM short of cuDNN (N=4096: 435 against 472); a third warpgroup on 192 query rows ran 484
(2 stages) / 496 (3 stages), N=16384 520 against cuDNN's 493 and the 128-row tile's 430-454;
causal N=4096 380, then 394 once each part skipped the key tiles past its own diagonal, 401
once a part past N skipped all (below; three calls, cuDNN 405 in each). Setting the two worker
consumers to 168 registers (the default partition gets what is left) ran 0.82-0.90x.
P goes from the score accumulator to the P V wgmma as a register operand (no shared-memory
round trip: for 16-bit P the layouts coincide). O leaves through shared memory (the consumer's
Q half, free once its last score product is done) and a TMA store; LSE (base 2, as the backward
expects) with plain stores.

Causal: key tiles above the diagonal are never loaded; only the tiles of the diagonal band are
masked. Programs take the heaviest query tiles first: within a head with two parts, across the
heads with three (the grid's fast axis then walks the heads; see gluon_launcher). With three
parts, each part masks from its own diagonal on and only releases (waits for and arrives on
the rings' barriers) the key tiles past it, which its neighbours still need.

Limits: N a multiple of 128 (the descriptors are (B*H*N, D) row views; a box past a head's end
would read the next head), D 64 or 128 (BLOCK_M 192: D=64 only), fp16/bf16, sm_90 (wgmma). A
192-row tile may overhang N (4096 = 21 x 192 + 64): since N % 64 == 0 a part lies wholly inside
the head or past its end; a part past the end reads the next head's Q rows (or TMA's zeros
after the last head), computes nothing, only releases the key tiles, and stores nothing.
Gluon kernels do not run in the CPU interpreter: on the CPU, tests build the kernel for sm_90
ahead of time (kernels/attention/aot_check.py) and the Tuner never offers this form.
"""
from __future__ import annotations

import math

import torch
import triton

from kernels.attention.flash_fwd import LOG2E

from kernels._gluon import GluonDescriptor, fence_async_shared, gl, gluon, hopper_unavailable
from kernels._gluon import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from kernels._gluon import tma_load as _tma_load
from kernels._gluon import tma_store as _tma_store

BLOCK_M = 128  # N's granularity: the query tile of two consumer warpgroups of 64 rows
SUB_M = 64  # a consumer warpgroup's query rows
CONSUMER_WARPS = 4
# registers per thread of the consumer warpgroups (setmaxnreg), by their count; the producer's
# warp takes 24. Two: 2 x 240 + 24 (the default partition gets the rest); three: 3 x 160 + 24
# of the 512 (65536 / 128 threads) a 16-warp program may hold.
CONSUMER_REGS = {2: 240, 3: 160}
# (BLOCK_M, BLOCK_N, num_warps, num_stages) as the forward's Tuner spells configs: BLOCK_M is
# 128 (two consumer warpgroups) or 192 (three, FlashAttention-3's tile at D=64, where the
# softmax's exponentials weigh as much as the matrix products and a third warpgroup gives the
# SM more of them to interleave); num_warps is a consumer partition's (the kernel runs
# BLOCK_M / 16 + 4 warps: the producer's warp is rounded up to a warpgroup), num_stages the K/V
# ring depth. Shared memory: Q BLOCK_M x D + STAGES x BLOCK_N x D for K and for V, 16-bit:
# D=128, BLOCK_N=128: 160 KiB at 2 stages, 224 at 3; D=64, BLOCK_M=192: 88 KiB and 120 KiB.
# On an H200 (tools/device/gluon_fwd_check.py --quick, N=4096 fp16, this kernel) 64-row key tiles
# ran 0.84-0.91x the 128-row ones at D=128 and at D=64: not timed.
GLUON_CONFIGS = {
    128: [(128, 128, 4, 2), (128, 128, 4, 3)],
    64: [(128, 128, 4, 2), (128, 128, 4, 3), (192, 128, 4, 2), (192, 128, 4, 3)],
}
SMEM_LIMIT = 232448  # bytes of shared memory a Hopper block may use (227 KiB)


if gluon is not None:
    @gluon.jit
    def _producer(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready,
                  k_empty, v_empty, head_row, q_row, n_iters, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr, NUM_WG: gl.constexpr):
        """TMA copies: Q's NUM_WG 64-row parts once, then K and V tile j into ring slot
        j % STAGES as soon as every consumer has released the slot's previous tile."""
        SUB: gl.constexpr = desc_q.block_type.shape[0]
        # read BLOCK_M x D of Q (TMA; rows past the head's end are never stored)
        mbarrier.expect(q_bar, NUM_WG * desc_q.block_type.nbytes)
        for w in gl.static_range(NUM_WG):
            _tma_load(desc_q, [q_row + w * SUB, 0], q_bar, q_smem.index(w))
        for j in range(n_iters):
            s = j % STAGES
            ph = (j // STAGES) & 1
            # read BLOCK_N x D of K (TMA)
            mbarrier.wait(k_empty.index(s), ph ^ 1)  # a fresh barrier passes parity 1
            mbarrier.expect(k_ready.index(s), desc_k.block_type.nbytes)
            _tma_load(desc_k, [head_row + j * BLOCK_N, 0],
                                            k_ready.index(s), k_smem.index(s))
            # read BLOCK_N x D of V (TMA)
            mbarrier.wait(v_empty.index(s), ph ^ 1)
            mbarrier.expect(v_ready.index(s), desc_v.block_type.nbytes)
            _tma_load(desc_v, [head_row + j * BLOCK_N, 0],
                                            v_ready.index(s), v_smem.index(s))

    @gluon.jit
    def _softmax(qk, m_i, l_i, qk_scale, rows, j, n_free, BLOCK_N: gl.constexpr,
                 CAUSAL: gl.constexpr, s_layout: gl.constexpr):
        """One online-softmax step (base 2) over a score tile: (p, alpha, m_new, l_new). Tiles
        j >= n_free (the causal diagonal band) are masked: key > query counts as -inf."""
        if CAUSAL:
            if j >= n_free:
                cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
                qk = gl.where(gl.expand_dims(rows, 1) >= gl.expand_dims(cols, 0), qk,
                              float("-inf"))
        m_new = gl.maximum(m_i, gl.max(qk, axis=1) * qk_scale)
        p = gl.exp2(qk * qk_scale - gl.expand_dims(m_new, 1))
        alpha = gl.exp2(m_i - m_new)
        return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)

    @gluon.jit
    def _consumer(desc_o, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty,
                  v_empty, turn, q_row, lse_row, start_m, tile_iters, n_free, n_ctx, qk_scale,
                  WG: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr,
                  NUM_WG: gl.constexpr):
        """One consumer warpgroup: query rows [WG * 64, WG * 64 + 64) of the program's tile,
        every key tile, its own wgmmas and softmax, then its part of O and LSE (none where
        its rows start past the head's end: a 192-row tile's last part when N % 192 != 0)."""
        nw: gl.constexpr = gl.num_warps()
        SUB_M: gl.constexpr = desc_o.block_type.shape[0]
        NEXT: gl.constexpr = (WG + 1) % NUM_WG  # PINGPONG hands the issue right round
        # With three parts (SKIP; PINGPONG needs every part at every tile): causal, a part's
        # own rows set which key tiles it needs (n_iters) and which it masks (from n_free on);
        # a part past the head's end needs none. The program's other tiles are only released
        # (the rings' empty barriers count every consumer). Two parts keep the plain loop: built
        # into every kernel, these branches measured D=128 non-causal 2-5 % slower on an H100
        # (same configs, one call) and causal D=128 the same.
        SKIP: gl.constexpr = NUM_WG == 3 and not PINGPONG
        n_iters = tile_iters
        wg_start = start_m + WG * SUB_M
        if SKIP:
            if CAUSAL:
                n_free = wg_start // BLOCK_N
                n_iters = gl.minimum(tile_iters, (wg_start + SUB_M + BLOCK_N - 1) // BLOCK_N)
            if wg_start >= n_ctx:  # a 192-row tile's last part past the head's end
                n_iters = 0
            live = n_iters > 0
            stores = wg_start < n_ctx
        else:
            live: gl.constexpr = True
            stores: gl.constexpr = True
        HEAD_DIM: gl.constexpr = desc_o.block_type.shape[1]
        dtype: gl.constexpr = desc_o.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[nw, 1], instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[nw, 1], instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                     k_width=2)
        s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
        o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
        rows = start_m + WG * SUB_M + gl.arange(0, SUB_M, layout=s_row)
        q = q_smem.index(WG)
        s_zero = gl.zeros([SUB_M, BLOCK_N], gl.float32, layout=s_layout)
        m_i = gl.full([SUB_M], float("-inf"), gl.float32, layout=s_row)
        l_i = gl.full([SUB_M], 0.0, gl.float32, layout=s_row)
        acc = gl.zeros([SUB_M, HEAD_DIM], gl.float32, layout=o_layout)
        if live:  # a part past the head's end only releases the tiles
            mbarrier.wait(q_bar, 0)
            if OVERLAP:
                # S_0 and its softmax; then each iteration issues S_j and P_{j-1} V_{j-1}
                mbarrier.wait(k_ready.index(0), 0)
                if PINGPONG:
                    mbarrier.wait(turn.index(WG), 0)
                tok = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False,
                                    is_async=True)
                if PINGPONG:
                    mbarrier.arrive(turn.index(NEXT), count=1)
                qk = warpgroup_mma_wait(0, deps=[tok])
                mbarrier.arrive(k_empty.index(0), count=1)
                p, alpha, m_i, l_i = _softmax(qk, m_i, l_i, qk_scale, rows, 0, n_free, BLOCK_N,
                                              CAUSAL, s_layout)
                p16 = gl.convert_layout(p.to(dtype), p_layout)
                for j in range(1, n_iters):
                    s = j % STAGES
                    sp = (j - 1) % STAGES
                    mbarrier.wait(k_ready.index(s), (j // STAGES) & 1)
                    mbarrier.wait(v_ready.index(sp), ((j - 1) // STAGES) & 1)
                    if PINGPONG:
                        mbarrier.wait(turn.index(WG), j & 1)
                    s_tok = warpgroup_mma(q, k_smem.index(s).permute((1, 0)), s_zero,
                                          use_acc=False, is_async=True)
                    o_tok = warpgroup_mma(p16, v_smem.index(sp), acc, is_async=True)
                    if PINGPONG:
                        mbarrier.arrive(turn.index(NEXT), count=1)
                    qk = warpgroup_mma_wait(1, deps=[s_tok])  # S_j done; P V may still run
                    mbarrier.arrive(k_empty.index(s), count=1)
                    p, alpha, m_i, l_i = _softmax(qk, m_i, l_i, qk_scale, rows, j, n_free,
                                                  BLOCK_N, CAUSAL, s_layout)
                    acc, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])
                    mbarrier.arrive(v_empty.index(sp), count=1)
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_row), 1)
                    p16 = gl.convert_layout(p.to(dtype), p_layout)
                sl = (n_iters - 1) % STAGES
                mbarrier.wait(v_ready.index(sl), ((n_iters - 1) // STAGES) & 1)
                o_tok = warpgroup_mma(p16, v_smem.index(sl), acc, is_async=True)
                acc = warpgroup_mma_wait(0, deps=[o_tok])
                mbarrier.arrive(v_empty.index(sl), count=1)
            else:
                for j in range(n_iters):
                    s = j % STAGES
                    ph = (j // STAGES) & 1
                    mbarrier.wait(k_ready.index(s), ph)
                    if PINGPONG:
                        mbarrier.wait(turn.index(WG), j & 1)
                    tok = warpgroup_mma(q, k_smem.index(s).permute((1, 0)), s_zero,
                                        use_acc=False, is_async=True)
                    if PINGPONG:
                        mbarrier.arrive(turn.index(NEXT), count=1)
                    qk = warpgroup_mma_wait(0, deps=[tok])
                    mbarrier.arrive(k_empty.index(s), count=1)
                    p, alpha, m_i, l_i = _softmax(qk, m_i, l_i, qk_scale, rows, j, n_free,
                                                  BLOCK_N, CAUSAL, s_layout)
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_row), 1)
                    p16 = gl.convert_layout(p.to(dtype), p_layout)
                    mbarrier.wait(v_ready.index(s), ph)
                    o_tok = warpgroup_mma(p16, v_smem.index(s), acc, is_async=True)
                    acc = warpgroup_mma_wait(0, deps=[o_tok])
                    mbarrier.arrive(v_empty.index(s), count=1)
        if SKIP:
            for j in range(n_iters, tile_iters):  # tiles this part does not need
                s = j % STAGES
                ph = (j // STAGES) & 1
                mbarrier.wait(k_ready.index(s), ph)  # the slot's previous tile: released by all
                mbarrier.arrive(k_empty.index(s), count=1)
                mbarrier.wait(v_ready.index(s), ph)
                mbarrier.arrive(v_empty.index(s), count=1)
        if stores:  # N % 64 == 0: a part is wholly in the head or past it
            # write 64 floats of LSE (base 2: m + log2 l, as the backward reads it)
            gl.store(LSE + lse_row + WG * SUB_M + gl.arange(0, SUB_M, layout=s_row),
                     m_i + gl.log2(l_i))
            out = acc / gl.expand_dims(gl.convert_layout(l_i, o_row), 1)
            # write 64 x D of O (TMA, through this warpgroup's Q part: its last S_j is done)
            q.store(out.to(dtype))
            fence_async_shared()
            _tma_store(desc_o, [q_row + WG * SUB_M, 0], q)
            tma.store_wait(0)

    @gluon.jit
    def _flash_fwd_gluon_kernel(desc_q, desc_k, desc_v, desc_o, LSE, n_ctx, qk_scale,
                                BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                                CAUSAL: gl.constexpr, OVERLAP: gl.constexpr,
                                PINGPONG: gl.constexpr, NUM_WG: gl.constexpr,
                                CONSUMER_REGS: gl.constexpr, HEADS_FIRST: gl.constexpr):
        """desc_q, desc_o: (B*H*N, D) rows in 64-row boxes; desc_k, desc_v: BLOCK_N-row boxes;
        LSE: (B*H, N) fp32. n_ctx % 128 == 0; a program's query tile is NUM_WG x 64 rows."""
        dtype: gl.constexpr = desc_q.dtype
        SUB_M: gl.constexpr = desc_q.block_type.shape[0]
        BM: gl.constexpr = NUM_WG * SUB_M
        n_tiles = (n_ctx + BM - 1) // BM
        if HEADS_FIRST:  # the grid's fast axis walks the heads: a tile of every head, then the next
            pid_m = gl.program_id(1)
            bh = gl.program_id(0)
        else:
            pid_m = gl.program_id(0)
            bh = gl.program_id(1)
        if CAUSAL:  # heaviest query tiles (most keys) first: they set the tail
            pid_m = n_tiles - 1 - pid_m
        head_row = bh * n_ctx
        start_m = pid_m * BM
        if CAUSAL:
            n_iters = gl.minimum((start_m + BM + BLOCK_N - 1) // BLOCK_N, n_ctx // BLOCK_N)
            n_free = start_m // BLOCK_N  # tiles left of the diagonal band (each part: its own)
        else:
            n_iters = n_ctx // BLOCK_N
            n_free = n_iters
        q_smem = gl.allocate_shared_memory(dtype, [NUM_WG] + desc_q.block_type.shape,
                                           desc_q.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_k.block_type.shape,
                                           desc_k.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_v.block_type.shape,
                                           desc_v.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)  # expect() is the producer's arrival
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=NUM_WG)  # every consumer releases a slot
            mbarrier.init(v_empty.index(i), count=NUM_WG)
        for w in gl.static_range(NUM_WG):
            mbarrier.init(turn.index(w), count=1)
        if PINGPONG:
            mbarrier.arrive(turn.index(0), count=1)  # consumer 0 issues first
        fence_async_shared()
        q_row = head_row + start_m
        lse_row = bh.to(gl.int64) * n_ctx + start_m
        # warps and registers per thread of the workers: consumers 1.., the producer. The
        # partitions' argument lists are spelled out: built as one shared tuple plus each WG
        # (`(0,) + args`), triton 3.9's Gluon frontend handed the layouts tuples instead of
        # constexprs (get_mma_layout refused them).
        if NUM_WG == 3:
            gl.warp_specialize([
                (_consumer, (desc_o, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready,
                             k_empty, v_empty, turn, q_row, lse_row, start_m, n_iters, n_free,
                             n_ctx, qk_scale, 0, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG,
                             NUM_WG)),
                (_consumer, (desc_o, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready,
                             k_empty, v_empty, turn, q_row, lse_row, start_m, n_iters, n_free,
                             n_ctx, qk_scale, 1, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG,
                             NUM_WG)),
                (_consumer, (desc_o, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready,
                             k_empty, v_empty, turn, q_row, lse_row, start_m, n_iters, n_free,
                             n_ctx, qk_scale, 2, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG,
                             NUM_WG)),
                (_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready,
                             v_ready, k_empty, v_empty, head_row, q_row, n_iters, BLOCK_N,
                             STAGES, NUM_WG)),
            ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])
        else:
            gl.warp_specialize([
                (_consumer, (desc_o, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready,
                             k_empty, v_empty, turn, q_row, lse_row, start_m, n_iters, n_free,
                             n_ctx, qk_scale, 0, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG,
                             NUM_WG)),
                (_consumer, (desc_o, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready,
                             k_empty, v_empty, turn, q_row, lse_row, start_m, n_iters, n_free,
                             n_ctx, qk_scale, 1, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG,
                             NUM_WG)),
                (_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready,
                             v_ready, k_empty, v_empty, head_row, q_row, n_iters, BLOCK_N,
                             STAGES, NUM_WG)),
            ], [4, 1], [CONSUMER_REGS, 24])


GL_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def unsupported(N: int, D: int, device: torch.device) -> str | None:
    """Why the Gluon forward cannot run this shape on `device` (None when it can)."""
    why = hopper_unavailable(device, "the Gluon forward")
    if why:
        return why
    if D not in GLUON_CONFIGS:
        return f"the Gluon forward takes head dim 64 or 128, got D={D}"
    if N % BLOCK_M:
        return (f"TMA boxes are whole query tiles of a head: N must be a multiple of "
                f"{BLOCK_M}, got N={N} (triton_flash masks ragged N)")
    return None


def configs_for(D: int, N: int) -> list[tuple[int, int, int, int]]:
    """The Gluon launch configurations for head dim D whose key tiles divide N (a 192-row
    query tile may overhang N: its last 64-row part then stores nothing)."""
    if N % BLOCK_M:
        return []
    return [c for c in GLUON_CONFIGS.get(D, []) if N % c[1] == 0]


def smem_bytes(cfg: tuple, D: int) -> int:
    """Shared memory of a launch (16-bit): Q's 64-row parts and the K and V rings."""
    return 2 * (cfg[0] * D + 2 * cfg[3] * cfg[1] * D)


def check_config(cfg: tuple, D: int) -> None:
    """A ValueError naming the field unless `cfg` (BLOCK_M, BLOCK_N, num_warps, num_stages)
    is one the Gluon kernel is written for, and fits shared memory at head dim D."""
    bm, bn, warps, stages = cfg[:4]
    if bm not in (128, 192):
        raise ValueError(f"config {tuple(cfg)}: the Gluon forward's BLOCK_M is 128 or 192 (two "
                         f"or three warpgroups of 64 query rows), got {bm}")
    if bm == 192 and D != 64:
        raise ValueError(f"config {tuple(cfg)}: the Gluon forward's BLOCK_M 192 (three "
                         f"warpgroups of {CONSUMER_REGS[3]} registers) takes D=64 only: at "
                         f"D={D} its accumulators spill")
    if warps != CONSUMER_WARPS:
        raise ValueError(f"config {tuple(cfg)}: the Gluon forward's num_warps is "
                         f"{CONSUMER_WARPS} per consumer warpgroup, got {warps}")
    if bn not in (64, 128):
        raise ValueError(f"config {tuple(cfg)}: the Gluon forward's BLOCK_N is 64 or 128, "
                         f"got {bn}")
    if not 2 <= stages <= 4:
        raise ValueError(f"config {tuple(cfg)}: the Gluon forward's num_stages (K/V ring "
                         f"depth) is 2 to 4, got {stages}")
    if smem_bytes(cfg, D) > SMEM_LIMIT:
        raise ValueError(f"config {tuple(cfg)}: num_stages {stages} of {bn}-row K and V tiles "
                         f"at D={D} need {smem_bytes(cfg, D)} B of shared memory, over the "
                         f"{SMEM_LIMIT} B a block may use")


def descriptors(rows: list[torch.Tensor], block_n: int) -> list:
    """Gluon TMA descriptors of the (B*H*N, D) row views of q, k, v, o: 64-row boxes for the
    query halves (q, o), BLOCK_N-row boxes for k and v, in the default swizzled layout."""
    D = rows[0].shape[-1]
    gdt = getattr(gl, GL_DTYPES[rows[0].dtype])
    return [GluonDescriptor.from_tensor(
                t, [box, D], gl.NVMMASharedLayout.get_default_for([box, D], gdt))
            for t, box in zip(rows, (SUB_M, block_n, block_n, SUB_M))]


def gluon_launcher(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, causal: bool):
    """`launch(config, overlap=True, pingpong=False, heads_first=None)`: the Gluon forward of
    contiguous q, k, v (B, H, N, D) into o and lse with config (BLOCK_M 128 or 192, BLOCK_N, 4,
    STAGES); the flags pick the variant (the Tuner's TMA: 4 is the default one). heads_first:
    the grid's fast axis walks the heads, so that causal programs start with every head's
    heaviest query tile rather than all of one head's tiles; None: on for causal launches of
    three warpgroups. One H100 (fp16, TFLOP/s, tile order by head / heads first): D=64 causal
    N=4096 396 / 411 (cuDNN 405), N=8192 461 / 484, N=16384 500 / 516, N=2048 327 / 330;
    non-causal D=64 491 / 477 at N=4096; D=128 (two warpgroups) causal N=4096 564 / 526."""
    B, H, N, D = q.shape
    qk_scale = LOG2E / math.sqrt(D)
    rows = [t.view(B * H * N, D) for t in (q, k, v, o)]

    def launch(cfg, overlap: bool = True, pingpong: bool = False,
               heads_first: bool | None = None):
        check_config(cfg, D)
        bm, bn, stages = cfg[0], cfg[1], cfg[3]
        if N % BLOCK_M or N % bn:
            raise ValueError(f"config {tuple(cfg)}: N={N} is not a multiple of {BLOCK_M} and "
                             f"of BLOCK_N")
        wg = bm // SUB_M
        if heads_first is None:  # causal, three parts: every head's heaviest tile first
            heads_first = causal and wg == 3
        grid = (B * H, triton.cdiv(N, bm)) if heads_first else (triton.cdiv(N, bm), B * H)
        _flash_fwd_gluon_kernel[grid](
            *descriptors(rows, bn), lse, N, qk_scale, BLOCK_N=bn, STAGES=stages, CAUSAL=causal,
            OVERLAP=overlap, PINGPONG=pingpong, NUM_WG=wg, CONSUMER_REGS=CONSUMER_REGS[wg],
            HEADS_FIRST=heads_first, num_warps=CONSUMER_WARPS)

    return launch
