"""FlashAttention backward for Hopper written in Gluon, in the form of FlashAttention-3: one
kernel walks each key tile's query tiles once and adds dQ into fp32 buffers with TMA
reductions, where flash_bwd.py's two kernels recompute Q K^T and dO V^T a second time for dQ
(five matmuls per tile pair instead of seven).

Why: the Triton backward stalled at 0.77-0.86x cuDNN at D=128 on an H100. The same one-pass
form in plain Triton (dK, dV and dQ in one kernel, atomics for dQ) measured 0.80-0.89x the
two-kernel form: with five matmuls in one dependency chain and dK, dV, S, dP and a dQ tile live
at once, it needs 255 registers and spills (an H100, triton 3.6, at (64, 128, 8, 2)). Gluon gives
what FA3 uses: asynchronous wgmma, a TMA producer warp, two consumer warpgroups with 240
registers each.

One program: BLOCK_N = 128 key rows of one head; B*H*N / 128 programs, each taking its (head,
key tile) from an atomic ticket (below).
- a 1-warp producer partition (24 registers) loads K and V once (TMA), then streams 64-row
  tiles of Q and dO, with their 64 floats of LSE and delta, into STAGES-deep rings, each slot
  with a ready and an empty mbarrier;
- two 4-warp consumer partitions; consumer w owns key rows [64 w, 64 w + 64): its dK and dV
  (64 x D fp32 each) stay in registers. Per query tile:
      S^T  = K_w Q^T        dP^T = V_w dO^T             (both issued before either is needed)
      P^T  = exp2(S^T * qk_scale - LSE)                 (while dP^T is on the tensor cores)
      dV  += P^T dO         (P^T from registers)
      dS^T = P^T * (dP^T - delta)
      dK  += dS^T Q         (dS^T from registers); dS^T also to shared memory, where the
                             two consumers' halves make dS (64 x 128) for
      dQ[:, D half w] = dS K[:, D half w]               (consumer w: its half of dQ's columns)
  and the dQ half, times 1/sqrt(D), leaves through shared memory by a TMA reduce-add
  (cp.reduce.async.bulk) into the head's fp32 buffer: (N / 128) adds per dQ element, in L2.
dS is double-buffered; a ready mbarrier (both halves written) and a free one (both consumers'
dQ products done) per buffer order the two consumers. The dQ products' B operands are column
halves of the K tile in shared memory.

Measured on an H100 (triton 3.6, B*N = 16k, H=16, D=128, do_bench medians; the first light
against the later steps, each in one lease): plain first light 443-469 TFLOP/s non-causal
(0.88-0.92x cuDNN; its source lines said a quarter of the consumers' stall samples waited on
the LSE and delta loads from global memory, and it spilled 12-30 registers); LSE and delta by
TMA into the rings: no spill, 495-507 non-causal and 442-451 causal at N=4096 (0.97-1.00x
cuDNN); then without the second copy of K (column halves of the K tile instead) a third ring
stage fits shared memory: at N >= 4096 506-549 non-causal, 446-534 causal (0.97-1.07x cuDNN in
that lease, whose own cuDNN figures moved by up to 12 % between two timings). Through the
harness (experiments/flash_bwd.yaml, runs in reports/examples/): 0.97-1.07x cuDNN at D=128,
N >= 4096.

The fp32 dQ buffers are a ring of `ring_slots` heads' (before the ring, B*H*N*D floats: twice
dQ's size, peak memory 577 MiB at D=128 where the two-kernel form holds 449 and cuDNN 577).
Programs draw tickets in the order they start, so heads start in order; head h adds into its
slot (h + B*H*(ring - 1)) mod ring, the slot of head h - ring, once head h - ring has left it:
head h - ring's last program (a per-head count of programs done) reads the slot back
(ld.global.cg, after an acquire), writes dQ in q's dtype, zeroes the slot and bumps the slot's
turn, on which head h's programs wait before they start. A program waits only on programs
holding earlier tickets, which are running: no deadlock, whatever order the GPU starts programs
in. Before counting itself done a consumer waits for its reductions to be written
(cp.async.bulk.wait_group 0; tma.store_wait only waits until shared memory has been read) and
fences them (fence.proxy.async.global); a waiting program fences after its acquire too. The
last `ring` heads (slots 0 .. ring - 1 by that offset) are not cast in the kernel: their slots
are not needed again, and one copy after the kernel writes them on the whole GPU (the last
head's cast alone on one SM was the run's tail). The delta kernel zeroes the ring and the
counters, so a backward is still three kernels (the Tuners' timing launches zero their own, a
fourth). One H100, flash_bwd.yaml's triton_flash and sdpa_cudnn cases (runs ...-016d ->
...-4826, one call): peak memory at D=128, N >= 4096, 577 -> 465-489 MiB (D=64: 289 -> 233-245;
the two-kernel form 449 and 225); triton_flash 4 faster, 32 same, 4 ambiguous, none slower;
0.99-1.07x cuDNN at D=128, N >= 4096 (the 0.99: non-causal N=8192 fp16). dQ's sums are added in
whatever order programs reach them: not bitwise deterministic (the Triton backward is).

Causal: a key tile's query tiles start at its own first row (the ones above see none of its
keys); its two 64-row diagonal tiles are masked. Programs with the most query tiles start first.

D=64 (since the kernel took D=128 only): the same kernel; each consumer's dQ half is then 32
columns, and the K tile's swizzle is narrowed to 64 bytes so that a half is whole swizzle atoms
(the dQ products' B operands; at 128 bytes a 32-column slice would cut an atom). One H100
(experiments/flash_bwd.yaml's D=64 cases, runs ...-7341 -> ...-783a in one call): picked at
N >= 4096, 1.02-1.19x the two-kernel form, 0.92-0.97x cuDNN there (0.80-0.95x before); peak
memory 225 -> 289 MiB at 16k tokens x 16 heads (cuDNN's 289).

Limits: D 64 or 128, N a multiple of 128, fp16/bf16, sm_90. Gluon does not run in the CPU
interpreter: on the CPU the kernel is built for sm_90 ahead of time (kernels/attention/
aot_check.py).
"""
from __future__ import annotations

import math

import torch
import triton

from kernels._common import sm_count
from kernels._gluon import GluonDescriptor, cta_barrier, fence_async_shared, gl, gluon
from kernels._gluon import hopper_unavailable, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from kernels._gluon import tma_atomic_add as _tma_atomic_add
from kernels._gluon import tma_load as _tma_load
from kernels.attention.flash_fwd import LOG2E

BLOCK_N = 128  # two consumer warpgroups of 64 key rows
BLOCK_M = 64   # query rows per step
CONSUMER_WARPS = 4
HEAD_DIMS = (64, 128)
# (BLOCK_M, BLOCK_N, num_warps, num_stages): num_warps is a consumer partition's, num_stages
# the Q/dO ring depth. Shared memory at D=128, 16-bit: K and V 2 x 32 KiB, dS 2 x 16 KiB, the
# dQ halves 2 x 16 KiB (fp32), and per stage Q and dO 2 x 16 KiB with 2 x 256 B of LSE and
# delta: 193 KiB at 2 stages, 225.5 KiB at 3 (a build adds about 0.5 KiB of barriers and
# alignment: 226 KiB at 3). Spills, since the programs take their tiles from a ticket (loaded
# row offsets ptxas cannot recompute): the GPU's triton 3.6 builds report n_spills up to 8
# (up to 4 before); the local triton 3.9 sm_90 builds spill 56 B (3 stages) and 40 B (2)
# causal, 96 B non-causal at 2 stages, none non-causal at 3 (aot_check.SPILL_BUDGET). D=64:
# 129.5 KiB at 3 stages, 113 KiB at 2 (builds: 130, 113.5); no spill in the local 3.9 builds
# (nor in the GPU's 3.6 ones before the ticket, run ...-0fbe).
GLUON_CONFIGS = {128: [(64, 128, 4, 3), (64, 128, 4, 2)],
                 64: [(64, 128, 4, 3), (64, 128, 4, 2)]}
SMEM_LIMIT = 232448
CAST_ROWS = 64  # rows of a slot per step of the in-kernel cast


if gluon is not None:
    @gluon.jit
    def _bwd_producer(desc_q, desc_k, desc_v, desc_do, desc_lse, desc_delta, q_smem, do_smem,
                      k_smem, v_smem, lse_smem, delta_smem, kv_bar, q_ready,
                      q_empty, do_ready, do_empty, kv_row, m_row, n_iters, STAGES: gl.constexpr):
        """TMA copies: K and V once, then Q with its LSE and dO with its
        delta for tile i into ring slot i % STAGES once both consumers have released the slot's
        previous tile."""
        BM: gl.constexpr = desc_q.block_type.shape[0]
        # read BLOCK_N x D of K and of V (TMA)
        mbarrier.expect(kv_bar, 2 * desc_k.block_type.nbytes)
        _tma_load(desc_k, [kv_row, 0], kv_bar, k_smem)
        _tma_load(desc_v, [kv_row, 0], kv_bar, v_smem)
        for i in range(n_iters):
            s = i % STAGES
            ph = (i // STAGES) & 1
            row = m_row + i * BM
            # read BLOCK_M x D of Q and BLOCK_M floats of LSE (TMA)
            mbarrier.wait(q_empty.index(s), ph ^ 1)  # a fresh barrier passes parity 1
            mbarrier.expect(q_ready.index(s),
                            desc_q.block_type.nbytes + desc_lse.block_type.nbytes)
            _tma_load(desc_q, [row, 0], q_ready.index(s), q_smem.index(s))
            _tma_load(desc_lse, [row], q_ready.index(s), lse_smem.index(s))
            # read BLOCK_M x D of dO and BLOCK_M floats of delta (TMA)
            mbarrier.wait(do_empty.index(s), ph ^ 1)
            mbarrier.expect(do_ready.index(s),
                            desc_do.block_type.nbytes + desc_delta.block_type.nbytes)
            _tma_load(desc_do, [row, 0], do_ready.index(s), do_smem.index(s))
            _tma_load(desc_delta, [row], do_ready.index(s), delta_smem.index(s))

    @gluon.jit
    def _writes_landed(NW: gl.constexpr):
        """Wait until this thread's TMA reductions have been written to global memory (not
        only read from shared memory: tma.store_wait waits for that), then order them and this
        thread's earlier generic writes before its later accesses of either proxy. Once per
        thread of the partition (the thread that issued the copies among them)."""
        one: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
        gl.inline_asm_elementwise(
            "cp.async.bulk.wait_group 0;\n\tfence.proxy.async.global;\n\tmov.u32 $0, 0;",
            "=r,r", [gl.full([32 * NW], 0, gl.int32, layout=one)], dtype=gl.int32,
            is_pure=False, pack=1)

    @gluon.jit
    def _bwd_consumer(desc_dqa, DK, DV, q_smem, do_smem, k_smem, v_smem, lse_smem,
                      delta_smem, ds_smem, dq_smem, kv_bar, q_ready, q_empty, do_ready, do_empty,
                      ds_ready, ds_free, kv_row, acc_row, start_n, m_lo, n_iters, n_masked,
                      qk_scale, sm_scale, WG: gl.constexpr, STAGES: gl.constexpr,
                      CAUSAL: gl.constexpr):
        """Consumer WG: key rows [WG * 64, WG * 64 + 64) of the program's tile (its dK, dV)
        and columns [WG * D/2, WG * D/2 + D/2) of each query tile's dQ."""
        nw: gl.constexpr = gl.num_warps()
        BM: gl.constexpr = q_smem.shape[1]
        HEAD_DIM: gl.constexpr = q_smem.shape[2]
        SUB_N: gl.constexpr = k_smem.shape[0] // 2
        DH: gl.constexpr = desc_dqa.block_type.shape[1]
        dtype: gl.constexpr = q_smem.dtype
        t_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[nw, 1], instr_shape=[16, BM, 16])
        kv_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[nw, 1], instr_shape=[16, HEAD_DIM, 16])
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[nw, 1], instr_shape=[16, DH, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout,
                                                     k_width=2)
        q_cols: gl.constexpr = gl.SliceLayout(0, t_layout)
        k_rows: gl.constexpr = gl.SliceLayout(1, t_layout)
        keys = start_n + WG * SUB_N + gl.arange(0, SUB_N, layout=k_rows)
        k_w = k_smem.slice(WG * SUB_N, SUB_N)
        v_w = v_smem.slice(WG * SUB_N, SUB_N)
        k_half = k_smem.slice(WG * DH, DH, dim=1)  # K's columns of this consumer's dQ half
        t_zero = gl.zeros([SUB_N, BM], gl.float32, layout=t_layout)
        dq_zero = gl.zeros([BM, DH], gl.float32, layout=dq_layout)
        dk = gl.zeros([SUB_N, HEAD_DIM], gl.float32, layout=kv_layout)
        dv = gl.zeros([SUB_N, HEAD_DIM], gl.float32, layout=kv_layout)
        mbarrier.wait(kv_bar, 0)
        for i in range(n_iters):
            s = i % STAGES
            ph = (i // STAGES) & 1
            buf = i % 2
            q = q_smem.index(s)
            do = do_smem.index(s)
            mbarrier.wait(q_ready.index(s), ph)
            st_tok = warpgroup_mma(k_w, q.permute((1, 0)), t_zero, use_acc=False,
                                   is_async=True)
            mbarrier.wait(do_ready.index(s), ph)
            dpt_tok = warpgroup_mma(v_w, do.permute((1, 0)), t_zero, use_acc=False,
                                    is_async=True)
            lse = lse_smem.index(s).load(q_cols)
            st = warpgroup_mma_wait(1, deps=[st_tok])      # S^T done; dP^T may still run
            pt = gl.exp2(st * qk_scale - gl.expand_dims(lse, 0))
            if CAUSAL:
                if i < n_masked:
                    cols = m_lo + i * BM + gl.arange(0, BM, layout=q_cols)
                    pt = gl.where(gl.expand_dims(cols, 0) >= gl.expand_dims(keys, 1), pt, 0.0)
            pt16 = gl.convert_layout(pt.to(dtype), a_layout)
            dv_tok = warpgroup_mma(pt16, do, dv, is_async=True)
            dpt = warpgroup_mma_wait(1, deps=[dpt_tok])    # dP^T done; dV may still run
            delta = delta_smem.index(s).load(q_cols)
            dst = (pt * (dpt - gl.expand_dims(delta, 0))).to(dtype)
            # dS^T's half to shared memory once both consumers' dQ products two steps back
            # are done with the buffer
            mbarrier.wait(ds_free.index(buf), ((i // 2) & 1) ^ 1)
            ds_smem.index(buf).slice(WG * SUB_N, SUB_N).store(dst)
            fence_async_shared()
            mbarrier.arrive(ds_ready.index(buf), count=1)
            dk_tok = warpgroup_mma(gl.convert_layout(dst, a_layout), q, dk, is_async=True)
            mbarrier.wait(ds_ready.index(buf), (i // 2) & 1)
            dq_tok = warpgroup_mma(ds_smem.index(buf).permute((1, 0)), k_half, dq_zero,
                                   use_acc=False, is_async=True)
            dv, dk, dq = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, dq_tok])
            mbarrier.arrive(ds_free.index(buf), count=1)
            mbarrier.arrive(q_empty.index(s), count=1)
            mbarrier.arrive(do_empty.index(s), count=1)
            # add BLOCK_M x D/2 floats of dQ (TMA reduce through this consumer's staging tile,
            # once its previous reduce has read it)
            tma.store_wait(0)
            cta_barrier()
            dq_smem.index(WG).store(dq * sm_scale)
            fence_async_shared()
            _tma_atomic_add(desc_dqa, [acc_row + i * BM, WG * DH], dq_smem.index(WG))
        _writes_landed(nw)  # the head's last program reads every dQ sum back (_cast_head)
        # write 64 x D of dK and of dV
        kv_rows: gl.constexpr = gl.SliceLayout(1, kv_layout)
        kv_cols: gl.constexpr = gl.SliceLayout(0, kv_layout)
        offs = (gl.expand_dims(gl.arange(0, SUB_N, layout=kv_rows), 1) * HEAD_DIM
                + gl.expand_dims(gl.arange(0, HEAD_DIM, layout=kv_cols), 0))
        first = (kv_row + WG * SUB_N).to(gl.int64) * HEAD_DIM
        gl.store(DV + first + offs, dv.to(dtype))
        gl.store(DK + first + offs, (dk * sm_scale).to(dtype))

    @gluon.jit
    def _cast_head(DQA, DQ, acc_row, out_row, n_ctx, HEAD_DIM: gl.constexpr,
                   ROWS: gl.constexpr):
        """DQ[out_row + r] = DQA[acc_row + r] in DQ's dtype for r < n_ctx, and
        DQA[acc_row + r] = 0 after (the ring slot ready for its next head)."""
        nw: gl.constexpr = gl.num_warps()
        TPR: gl.constexpr = HEAD_DIM // 4  # threads per row: 4 floats (16 bytes) each
        layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 // TPR, TPR], [nw, 1], [1, 0])
        offs = (gl.expand_dims(gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout)), 1)
                * HEAD_DIM
                + gl.expand_dims(gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout)), 0))
        zero = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=layout)
        src = DQA + acc_row.to(gl.int64) * HEAD_DIM
        dst = DQ + out_row.to(gl.int64) * HEAD_DIM
        for r in range(0, n_ctx, ROWS):
            # read 64 x D floats of the slot (from L2: other SMs added them); write 64 x D of
            # dQ and 64 x D zeros
            acc = gl.load(src + r * HEAD_DIM + offs, cache_modifier=".cg")
            gl.store(dst + r * HEAD_DIM + offs, acc.to(DQ.dtype.element_ty))
            gl.store(src + r * HEAD_DIM + offs, zero)

    @gluon.jit
    def _flash_bwd_gluon_kernel(desc_q, desc_k, desc_v, desc_do, desc_dqa, desc_lse,
                                desc_delta, DK, DV, DQ, DQA, SYNC, n_ctx, n_bh, ring, qk_scale,
                                sm_scale, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                                CAST_ROWS: gl.constexpr):
        """desc_q, desc_do: (B*H*N, D) rows in 64-row boxes; desc_k, desc_v: 128-row boxes;
        desc_dqa: the fp32 dQ ring (ring * N, D) in 64 x D/2 boxes, DQA the same memory;
        desc_lse, desc_delta: (B*H*N,) fp32 in 64-float boxes; DK, DV, DQ: (B*H*N, D);
        SYNC: 1 + 2 * n_bh int32 zeros: the ticket, then a turn per ring slot (the first `ring`
        of n_bh entries), then per head its programs done. n_ctx % 128 == 0; one program per
        (head, key tile), in ticket order. Head h's slot is (h + n_bh * (ring - 1)) % ring, so
        that the last `ring` heads, which the launcher copies out, hold slots 0 .. ring - 1."""
        dtype: gl.constexpr = desc_q.dtype
        BM: gl.constexpr = desc_q.block_type.shape[0]
        BN: gl.constexpr = desc_k.block_type.shape[0]
        HEAD_DIM: gl.constexpr = desc_q.block_type.shape[1]
        n_tiles = n_ctx // BN
        # tickets in the order programs start: every program a ticket names started before
        # this one, so a program waits only on programs that run (no deadlock, whatever
        # order the GPU launches them in)
        ticket = gl.atomic_add(SYNC, 1, sem="relaxed", scope="gpu")
        bh = ticket // n_tiles
        start_n = (ticket % n_tiles) * BN  # causal: a head's first ticket has the most tiles
        slot = (bh + n_bh * (ring - 1)) % ring
        if bh >= ring:
            # head bh - ring's dQ must have left the slot: its last program bumps the slot's
            # turn (SYNC[1 + slot]); SYNC[1 + n_bh + head] counts a head's programs done
            turn = gl.atomic_add(SYNC + 1 + slot, 0, sem="acquire", scope="gpu")
            while turn < bh // ring:
                turn = gl.atomic_add(SYNC + 1 + slot, 0, sem="acquire", scope="gpu")
            _writes_landed(gl.num_warps())  # the slot's zeros before this head's TMA adds
        head_row = bh * n_ctx
        if CAUSAL:
            m_lo = start_n
        else:
            m_lo = 0
        n_iters = (n_ctx - m_lo) // BM
        q_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_q.block_type.shape,
                                           desc_q.layout)
        do_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_do.block_type.shape,
                                            desc_do.layout)
        k_smem = gl.allocate_shared_memory(dtype, desc_k.block_type.shape, desc_k.layout)
        v_smem = gl.allocate_shared_memory(dtype, desc_v.block_type.shape, desc_v.layout)
        lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + desc_lse.block_type.shape,
                                             desc_lse.layout)
        delta_smem = gl.allocate_shared_memory(gl.float32,
                                               [STAGES] + desc_delta.block_type.shape,
                                               desc_delta.layout)
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BM], dtype)
        ds_smem = gl.allocate_shared_memory(dtype, [2, BN, BM], ds_layout)
        dq_smem = gl.allocate_shared_memory(gl.float32, [2] + desc_dqa.block_type.shape,
                                            desc_dqa.layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for j in gl.static_range(STAGES):
            mbarrier.init(q_ready.index(j), count=1)  # expect() is the producer's arrival
            mbarrier.init(do_ready.index(j), count=1)
            mbarrier.init(q_empty.index(j), count=2)  # both consumers release a slot
            mbarrier.init(do_empty.index(j), count=2)
        for j in gl.static_range(2):
            mbarrier.init(ds_ready.index(j), count=2)
            mbarrier.init(ds_free.index(j), count=2)
        fence_async_shared()
        kv_row = head_row + start_n
        m_row = head_row + m_lo
        acc_row = slot * n_ctx + m_lo  # the head's dQ rows in its ring slot
        n_masked = BN // BM if CAUSAL else 0
        gl.warp_specialize([
            (_bwd_consumer, (desc_dqa, DK, DV, q_smem, do_smem, k_smem, v_smem, lse_smem,
                             delta_smem, ds_smem, dq_smem, kv_bar, q_ready, q_empty, do_ready,
                             do_empty, ds_ready, ds_free, kv_row, acc_row, start_n, m_lo,
                             n_iters, n_masked, qk_scale, sm_scale, 0, STAGES, CAUSAL)),
            (_bwd_consumer, (desc_dqa, DK, DV, q_smem, do_smem, k_smem, v_smem, lse_smem,
                             delta_smem, ds_smem, dq_smem, kv_bar, q_ready, q_empty, do_ready,
                             do_empty, ds_ready, ds_free, kv_row, acc_row, start_n, m_lo,
                             n_iters, n_masked, qk_scale, sm_scale, 1, STAGES, CAUSAL)),
            (_bwd_producer, (desc_q, desc_k, desc_v, desc_do, desc_lse, desc_delta, q_smem,
                             do_smem, k_smem, v_smem, lse_smem, delta_smem, kv_bar, q_ready,
                             q_empty, do_ready, do_empty, kv_row, m_row, n_iters, STAGES)),
        ], [4, 1], [240, 24])  # warps and registers per thread: consumer 1, the producer
        # both consumers' dQ reductions have been written (_writes_landed): count this program
        # done; the head's last one casts the slot into dQ, zeroes it and hands it on. The
        # head and slot again from kv_row and the arguments: values kept from before the
        # partitions would hold registers through consumer 0's loop (the build spilled)
        # (the last `ring` heads' slots are not needed again: the launcher copies them out
        # after the kernel, on the whole GPU, where here the last head's cast would run on one
        # SM while the others idle)
        head = kv_row // n_ctx
        if head < n_bh - ring:
            prior = gl.atomic_add(SYNC + 1 + n_bh + head, 1, sem="acq_rel", scope="gpu")
            if prior == n_ctx // BN - 1:
                head_slot = (head + n_bh * (ring - 1)) % ring
                _cast_head(DQA, DQ, head_slot * n_ctx, head * n_ctx, n_ctx, HEAD_DIM, CAST_ROWS)
                _writes_landed(gl.num_warps())  # the zeros before the next head's TMA adds
                cta_barrier()
                gl.atomic_add(SYNC + 1 + head_slot, 1, sem="release", scope="gpu")


GL_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def unsupported(N: int, D: int, device: torch.device) -> str | None:
    """Why the Gluon backward cannot run this shape on `device` (None when it can)."""
    why = hopper_unavailable(device, "the Gluon backward")
    if why:
        return why
    if _tma_atomic_add is None:
        return (f"the Gluon backward adds dQ by a TMA reduce-add, which this triton "
                f"({triton.__version__}) does not build")
    if D not in HEAD_DIMS:
        return f"the Gluon backward takes head dim 64 or 128, got D={D}"
    if N % BLOCK_N:
        return (f"TMA boxes are whole key tiles of a head: N must be a multiple of {BLOCK_N}, "
                f"got N={N}")
    return None


def smem_bytes(cfg: tuple, D: int) -> int:
    """Shared memory of a launch (16-bit inputs): K and V, the Q and dO rings with their LSE
    and delta, dS's two buffers and the consumers' fp32 dQ staging tiles."""
    stages = cfg[3]
    return (2 * (2 * BLOCK_N * D + 2 * stages * BLOCK_M * D + 2 * BLOCK_N * BLOCK_M)
            + 4 * BLOCK_M * D + 4 * 2 * stages * BLOCK_M)


def check_config(cfg: tuple, D: int) -> None:
    """A ValueError naming the field unless `cfg` (BLOCK_M, BLOCK_N, num_warps, num_stages)
    is one the Gluon backward is written for and fits shared memory at head dim D."""
    bm, bn, warps, stages = cfg[:4]
    if (bm, bn) != (BLOCK_M, BLOCK_N):
        raise ValueError(f"config {tuple(cfg)}: the Gluon backward's tiles are BLOCK_M "
                         f"{BLOCK_M}, BLOCK_N {BLOCK_N}, got {bm}, {bn}")
    if warps != CONSUMER_WARPS:
        raise ValueError(f"config {tuple(cfg)}: the Gluon backward's num_warps is "
                         f"{CONSUMER_WARPS} per consumer warpgroup, got {warps}")
    if not 1 <= stages <= 3:
        raise ValueError(f"config {tuple(cfg)}: the Gluon backward's num_stages (Q/dO ring "
                         f"depth) is 1 to 3, got {stages}")
    if smem_bytes(cfg, D) > SMEM_LIMIT:
        raise ValueError(f"config {tuple(cfg)}: num_stages {stages} at D={D} needs "
                         f"{smem_bytes(cfg, D)} B of shared memory, over the {SMEM_LIMIT} B a "
                         f"block may use")


def configs_for(D: int, N: int) -> list[tuple[int, int, int, int]]:
    """The Gluon backward's launch configurations for head dim D whose tiles divide N."""
    return [c for c in GLUON_CONFIGS.get(D, []) if N % c[1] == 0]


def descriptors(q, k, v, do, dqa, lse, delta) -> list:
    """Gluon TMA descriptors of (B*H*N, D) row views: q, do in 64-row boxes; k, v in 128-row
    boxes; the fp32 dQ buffer in 64 x D/2 boxes; and of the flat
    (B*H*N,) fp32 LSE and delta in 64-float boxes."""
    D = q.shape[-1]
    gdt = getattr(gl, GL_DTYPES[q.dtype])

    def desc(t, box, dt):
        return GluonDescriptor.from_tensor(t, box, gl.NVMMASharedLayout.get_default_for(box, dt))
    flat = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)
    # K's swizzle no wider than a dQ half's columns (D/2 x 2 bytes), so that each consumer's
    # column half of the K tile is whole swizzle atoms (the dQ products' B operands)
    k_desc = (desc(k, [BLOCK_N, D], gdt) if D >= 128 else GluonDescriptor.from_tensor(
        k, [BLOCK_N, D], gl.NVMMASharedLayout(swizzle_byte_width=D, element_bitwidth=16, rank=2)))
    return [desc(q, [BLOCK_M, D], gdt), k_desc, desc(v, [BLOCK_N, D], gdt),
            desc(do, [BLOCK_M, D], gdt),
            desc(dqa, [BLOCK_M, D // 2], gl.float32),
            GluonDescriptor.from_tensor(lse, [BLOCK_M], flat),
            GluonDescriptor.from_tensor(delta, [BLOCK_M], flat)]


def ring_slots(B: int, H: int, N: int, causal: bool, n_sm: int) -> int:
    """fp32 dQ accumulators (ring slots, one head's N x D each) for a launch: enough that a
    head's first program rarely finds its slot still held by the head `ring` places before.

    Programs start in ticket order, one per SM (shared memory), N / 128 per head. Head h's
    slot frees when its last program ends, at most one program's time after that program
    started; meanwhile the other SMs draw about n_sm * (longest / average program time) more
    tickets: 1x non-causal, 2x causal (a head's first key tile walks all N / 64 query tiles,
    its last two). A quarter more for the spread of program times and the last program's
    cast, and two slots besides. Not B*H: memory bounded by the heads in flight.

    Fewer slots make programs wait (one H100, do_bench medians, this formula against
    1 + ceil(longest * n_sm / per_head) and max(2, ceil(longest * n_sm / per_head)), one call):
    D=128 N=4096 non-causal 2.64-2.67 ms with 8 slots, 2.77 with 6, 3.07-3.09 with 5; causal
    1.59 with 13, 1.66 with 10, 1.78 with 9; N=16384 within 2 % at 4, 3 or 2 slots."""
    per_head = N // BLOCK_N
    longest = 2.0 if causal else 1.0
    return min(B * H, 2 + math.ceil(1.25 * longest * n_sm / per_head))


def gluon_launcher(q, k, v, do, lse, delta, dq, dk, dv, causal: bool):
    """`launch(config, zero_with=None)`: the one-pass Gluon backward of contiguous q, k, v, do
    (B, H, N, D) with `config` (64, 128, 4, STAGES): dq, dk, dv written. dQ adds up in fp32 in
    a ring of `ring_slots` heads' buffers (not one per head): each head's last program casts its
    slot into dq and zeroes it for a later head; the last `ring` heads' slots are copied out
    after the kernel. `zero_with(acc, sync)` zeroes the ring and counters (the delta kernel,
    which must then run: flash_bwd.preprocess); without it a memset does."""
    B, H, N, D = q.shape
    sm_scale = 1.0 / math.sqrt(D)
    rows = [t.view(B * H * N, D) for t in (q, k, v, do)]
    ring = ring_slots(B, H, N, causal, sm_count(q.device))

    def launch(cfg, zero_with=None):
        check_config(cfg, D)
        if N % BLOCK_N:
            raise ValueError(f"config {tuple(cfg)}: N={N} is not a multiple of {BLOCK_N}")
        # buffers of this launch alone, one allocation: the ring (fp32), then the int32 ticket
        # and counters. Not kept across launches: the Tuners compile candidates by launching
        # them from several threads at once, and two kernels drawing tickets from one counter
        # would each wait for programs the other ran
        size = ring * N * D + 1 + 2 * B * H
        scratch = (torch.zeros if zero_with is None else torch.empty)(
            size, device=q.device, dtype=torch.float32)
        acc = scratch[:ring * N * D].view(ring * N, D)
        sync = scratch[ring * N * D:].view(torch.int32)
        if zero_with is not None:
            zero_with(acc, sync)
        _flash_bwd_gluon_kernel[((N // BLOCK_N) * B * H,)](
            *descriptors(*rows, acc, lse.view(-1), delta.view(-1)), dk, dv, dq, acc, sync, N,
            B * H, ring, sm_scale * LOG2E, sm_scale, STAGES=cfg[3], CAUSAL=causal,
            CAST_ROWS=CAST_ROWS, num_warps=CONSUMER_WARPS)
        # the last `ring` heads, uncast by the kernel, in slots 0 .. ring - 1 (fp32 -> q's dtype)
        dq.view(B * H, N * D)[B * H - ring:].copy_(acc.view(ring, N * D))

    return launch

