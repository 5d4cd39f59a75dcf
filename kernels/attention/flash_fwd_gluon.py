"""FlashAttention forward for Hopper written in Gluon (triton.experimental.gluon), in the form
of FlashAttention-3: explicit asynchronous wgmma, a TMA producer warp, two consumer
warpgroups.

Why a third form: the TMA kernel (flash_fwd_tma.py) stalled at 0.73-0.89x cuDNN at D=128 on an
H200. Its profile said latency-bound (tensor pipe ~50 %); the FA3 remedies need control that
Triton's language does not give: Triton keeps a wgmma in flight only along a loop-carried
accumulator chain, so a score tile's exponentials cannot run while the tensor cores work on
the next tile (see flash_fwd_tma.py). Gluon exposes the hardware's pieces: `warpgroup_mma(...,
is_async=True)` / `warpgroup_mma_wait(n)`, mbarriers, TMA copies, warp specialization with
per-partition register budgets.

Structure of one program (BLOCK_M = 128 query rows of one head, grid (N / 128, B*H)):
- a 1-warp producer partition (24 registers) issues the TMA copies: Q once (two 64-row
  halves), then K and V tiles of BLOCK_N rows into STAGES-deep rings, each slot with a ready
  mbarrier (the copy's transaction count) and an empty one (both consumers released it);
- two 4-warp consumer partitions (240 registers each), one per 64-row half of the query tile,
  each issuing its own wgmmas (a Hopper accumulator lives in the issuing warpgroup's
  registers) and running its own online softmax (base 2, as flash_fwd.py);
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
P goes from the score accumulator to the P V wgmma as a register operand (no shared-memory
round trip: for 16-bit P the layouts coincide). O leaves through shared memory (the consumer's
Q half, free once its last score product is done) and a TMA store; LSE (base 2, as the backward
expects) with plain stores.

Causal: key tiles above the diagonal are never loaded; only the tiles of the 128-wide diagonal
band are masked. Programs take the heaviest query tiles first.

Limits: N a multiple of 128 (the descriptors are (B*H*N, D) row views; a box past a head's end
would read the next head), D 64 or 128, fp16/bf16, sm_90 (wgmma). Gluon kernels do not run in
the CPU interpreter: on the CPU, tests build the kernel for sm_90 ahead of time
(kernels/attention/aot_check.py) and the Tuner never offers this form.
"""
from __future__ import annotations

import math

import torch

from kernels.attention.flash_fwd import LOG2E

from kernels._gluon import GluonDescriptor, fence_async_shared, gl, gluon, hopper_unavailable
from kernels._gluon import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from kernels._gluon import tma_load as _tma_load
from kernels._gluon import tma_store as _tma_store

BLOCK_M = 128  # two consumer warpgroups of 64 query rows
CONSUMER_WARPS = 4
# (BLOCK_M, BLOCK_N, num_warps, num_stages) as the forward's Tuner spells configs: num_warps is
# a consumer partition's (the kernel runs 2 x 4 + 4 warps: the producer's warp is rounded up
# to a warpgroup), num_stages the K/V ring depth. Shared memory: Q 2 x 64 x D + STAGES x
# BLOCK_N x D for K and for V, 16-bit: D=128, BLOCK_N=128: 160 KiB at 2 stages, 224 at 3.
# On an H200 (tools/device/gluon_fwd_check.py --quick, N=4096 fp16, this kernel) 64-row key tiles
# ran 0.84-0.91x the 128-row ones at D=128 and at D=64: not timed.
GLUON_CONFIGS = {
    128: [(128, 128, 4, 2), (128, 128, 4, 3)],
    64: [(128, 128, 4, 2), (128, 128, 4, 3)],
}
SMEM_LIMIT = 232448  # bytes of shared memory a Hopper block may use (227 KiB)


if gluon is not None:
    @gluon.jit
    def _producer(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready,
                  k_empty, v_empty, head_row, q_row, n_iters, BLOCK_N: gl.constexpr,
                  STAGES: gl.constexpr):
        """TMA copies: Q's two halves once, then K and V tile j into ring slot j % STAGES as
        soon as both consumers have released the slot's previous tile."""
        SUB_M: gl.constexpr = desc_q.block_type.shape[0]
        # read BLOCK_M x D of Q (TMA)
        mbarrier.expect(q_bar, 2 * desc_q.block_type.nbytes)
        _tma_load(desc_q, [q_row, 0], q_bar, q_smem.index(0))
        _tma_load(desc_q, [q_row + SUB_M, 0], q_bar, q_smem.index(1))
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
                  v_empty, turn, q_row, lse_row, start_m, n_iters, n_free, qk_scale,
                  WG: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                  CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr):
        """One consumer warpgroup: query rows [WG * 64, WG * 64 + 64) of the program's tile,
        every key tile, its own wgmmas and softmax, then its half of O and LSE."""
        nw: gl.constexpr = gl.num_warps()
        SUB_M: gl.constexpr = desc_o.block_type.shape[0]
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
        mbarrier.wait(q_bar, 0)
        if OVERLAP:
            # S_0 and its softmax; then each iteration issues S_j and P_{j-1} V_{j-1}
            mbarrier.wait(k_ready.index(0), 0)
            if PINGPONG:
                mbarrier.wait(turn.index(WG), 0)
            tok = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False,
                                is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - WG), count=1)
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
                    mbarrier.arrive(turn.index(1 - WG), count=1)
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
                    mbarrier.arrive(turn.index(1 - WG), count=1)
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
        # write 64 floats of LSE (base 2: m + log2 l, as the backward reads it)
        gl.store(LSE + lse_row + WG * SUB_M + gl.arange(0, SUB_M, layout=s_row),
                 m_i + gl.log2(l_i))
        out = acc / gl.expand_dims(gl.convert_layout(l_i, o_row), 1)
        # write 64 x D of O (TMA, through this warpgroup's Q half: its last S_j is done)
        q.store(out.to(dtype))
        fence_async_shared()
        _tma_store(desc_o, [q_row + WG * SUB_M, 0], q)
        tma.store_wait(0)

    @gluon.jit
    def _flash_fwd_gluon_kernel(desc_q, desc_k, desc_v, desc_o, LSE, n_ctx, qk_scale,
                                BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                                CAUSAL: gl.constexpr, OVERLAP: gl.constexpr,
                                PINGPONG: gl.constexpr):
        """desc_q, desc_o: (B*H*N, D) rows in 64-row boxes; desc_k, desc_v: BLOCK_N-row boxes;
        LSE: (B*H, N) fp32. n_ctx % 128 == 0."""
        dtype: gl.constexpr = desc_q.dtype
        SUB_M: gl.constexpr = desc_q.block_type.shape[0]
        BM: gl.constexpr = 2 * SUB_M
        n_tiles = n_ctx // BM
        pid_m = gl.program_id(0)
        if CAUSAL:  # heaviest query tiles (most keys) first: they set the tail
            pid_m = n_tiles - 1 - pid_m
        bh = gl.program_id(1)
        head_row = bh * n_ctx
        start_m = pid_m * BM
        if CAUSAL:
            n_iters = (start_m + BM) // BLOCK_N
            n_free = start_m // BLOCK_N  # tiles left of the diagonal band: no mask
        else:
            n_iters = n_ctx // BLOCK_N
            n_free = n_iters
        q_smem = gl.allocate_shared_memory(dtype, [2] + desc_q.block_type.shape, desc_q.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_k.block_type.shape,
                                           desc_k.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_v.block_type.shape,
                                           desc_v.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)  # expect() is the producer's arrival
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)  # both consumers release a slot
            mbarrier.init(v_empty.index(i), count=2)
        mbarrier.init(turn.index(0), count=1)
        mbarrier.init(turn.index(1), count=1)
        if PINGPONG:
            mbarrier.arrive(turn.index(0), count=1)  # consumer 0 issues first
        fence_async_shared()
        q_row = head_row + start_m
        lse_row = bh.to(gl.int64) * n_ctx + start_m
        gl.warp_specialize([
            (_consumer, (desc_o, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready,
                         k_empty, v_empty, turn, q_row, lse_row, start_m, n_iters, n_free,
                         qk_scale, 0, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG)),
            (_consumer, (desc_o, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready,
                         k_empty, v_empty, turn, q_row, lse_row, start_m, n_iters, n_free,
                         qk_scale, 1, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG)),
            (_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready,
                         v_ready, k_empty, v_empty, head_row, q_row, n_iters, BLOCK_N,
                         STAGES)),
        ], [4, 1], [240, 24])  # warps and registers per thread: consumer 1, the producer


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
    """The Gluon launch configurations for head dim D whose key tiles divide N."""
    return [c for c in GLUON_CONFIGS.get(D, []) if N % c[0] == 0 and N % c[1] == 0]


def smem_bytes(cfg: tuple, D: int) -> int:
    """Shared memory of a launch (16-bit): Q's two 64-row halves and the K and V rings."""
    return 2 * (BLOCK_M * D + 2 * cfg[3] * cfg[1] * D)


def check_config(cfg: tuple, D: int) -> None:
    """A ValueError naming the field unless `cfg` (BLOCK_M, BLOCK_N, num_warps, num_stages)
    is one the Gluon kernel is written for, and fits shared memory at head dim D."""
    bm, bn, warps, stages = cfg[:4]
    if bm != BLOCK_M:
        raise ValueError(f"config {tuple(cfg)}: the Gluon forward's BLOCK_M is {BLOCK_M} (two "
                         f"warpgroups of 64 query rows), got {bm}")
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
            for t, box in zip(rows, (BLOCK_M // 2, block_n, block_n, BLOCK_M // 2))]


def gluon_launcher(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, causal: bool):
    """`launch(config, overlap=True, pingpong=False)`: the Gluon forward of contiguous q, k, v
    (B, H, N, D) into o and lse with config (128, BLOCK_N, 4, STAGES); the flags pick the
    variant (the Tuner's TMA: 4 is the default one)."""
    B, H, N, D = q.shape
    qk_scale = LOG2E / math.sqrt(D)
    rows = [t.view(B * H * N, D) for t in (q, k, v, o)]

    def launch(cfg, overlap: bool = True, pingpong: bool = False):
        check_config(cfg, D)
        bn, stages = cfg[1], cfg[3]
        if N % BLOCK_M:
            raise ValueError(f"config {tuple(cfg)}: N={N} is not a multiple of {BLOCK_M}")
        _flash_fwd_gluon_kernel[(N // BLOCK_M, B * H)](
            *descriptors(rows, bn), lse, N, qk_scale, BLOCK_N=bn, STAGES=stages, CAUSAL=causal,
            OVERLAP=overlap, PINGPONG=pingpong, num_warps=CONSUMER_WARPS)

    return launch
