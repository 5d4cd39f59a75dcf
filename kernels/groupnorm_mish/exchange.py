"""How the S programs of a group swap their partial sums inside one kernel (the synchronised
form in triton_groupnorm_mish.py and the shared-memory form in smem_gluon.py both call these
@triton.jit functions).

Each partial travels as one int64 word: the fp32 sum's bits below, an epoch above. A reader
polls the other S - 1 words of its group until every one carries this launch's epoch: the
value and the flag that says it is current arrive in one 8-byte store, so no fence orders
them and no counter is kept. The epochs of a group's words move in lockstep: every launch
writes each of its tiles' words once, one above the word's last epoch (zeros when the buffer
is new), so a program learns this launch's epoch from its own word's last one (a load whose
round trip overlaps the sums), and a word of another tile is either last launch's (one below)
or this one's. The count-then-poll handshake this replaced (partials stored, a release atomic
whose value Triton hands from thread 0 to the other threads behind a CTA barrier, acquire
atomics polled until the count reached S, then the partials loaded) took three or four L2
round trips after the slowest program's sums, this one the last store and a poll. On an H200
(runs ...-7532, ...-ac32 against ...-63b7) the two were within noise of each other once a
single warp polled (every warp polling its own copy cost the shared-memory form 9-12 % at 128
groups): the S > 1 forms do not wait on the exchange's latency.

The S words are added in a fixed order (each program's own from its registers: the same bits
it stored), so every program of a group gets the same statistics, and each launch the same.
The words are kept per device, stream and S (exchange_words in triton_groupnorm_mish.py).
"""
import triton
import triton.language as tl

EPOCHS: tl.constexpr = tl.constexpr(1 << 30)  # epochs wrap here (a word keeps 32 bits of one)


def lanes(split: int, warps: int) -> int:
    """K, the length of `_gather`'s lane vector: a power of two covering the S = `split` tiles
    and one lane per thread of a `warps`-warp program (so one warp's lanes poll)."""
    return max(triton.next_power_of_2(split), 32 * warps)


@triton.jit
def _epoch(part_ptr, t, AHEAD: tl.constexpr):
    """The epoch of tile t's word (volatile: from L2), plus AHEAD (1: the one this launch
    writes, before it has; 0: after); int32."""
    return (((tl.load(part_ptr + 2 * t, volatile=True) >> 32) + AHEAD) % EPOCHS).to(tl.int32)


@triton.jit
def _word(v, epoch):
    """fp32 `v` and its epoch in one int64 (epoch above, v's bits below)."""
    return (epoch.to(tl.int64) << 32) | v.to(tl.int32, bitcast=True).to(tl.uint32, bitcast=True).to(tl.int64)


@triton.jit
def _publish(part_ptr, t, s1, s2, epoch):
    """Store tile t's two partials as words of this launch's epoch."""
    tl.store(part_ptr + 2 * t, _word(s1, epoch))
    tl.store(part_ptr + 2 * t + 1, _word(s2, epoch))


@triton.jit
def _gather(part_ptr, t0, me, kk, S: tl.constexpr, s1, s2, epoch):
    """The group's sums: its S tiles' words at slots t0 .. t0 + S - 1, polled until every
    other tile's carries `epoch`, this tile's (me) from registers; added in the order of kk
    (arange(0, K), K >= S, built by the caller one element per thread, so that the S - 1
    lanes of one warp poll and the others only wait on the loop's block reduction: when
    every warp polled its own copy, the shared-memory form at 128 groups ran 9 % slower).
    Read by relaxed gpu-scope atomic adds of 0 (L2, never a stale L1 line, never hoisted out
    of the loop; ptxas makes them strong loads)."""
    others = (kk < S) & (kk != me)
    p = part_ptr + 2 * (t0 + kk)
    zero = (kk * 0).to(tl.int64)  # in kk's layout (Gluon does not broadcast a scalar here)
    w1 = tl.atomic_add(p, zero, mask=others, sem="relaxed", scope="gpu")
    w2 = tl.atomic_add(p + 1, zero, mask=others, sem="relaxed", scope="gpu")
    while tl.sum((others & (((w1 >> 32).to(tl.int32) != epoch)
                            | ((w2 >> 32).to(tl.int32) != epoch))).to(tl.int32), axis=0) > 0:
        w1 = tl.atomic_add(p, zero, mask=others, sem="relaxed", scope="gpu")
        w2 = tl.atomic_add(p + 1, zero, mask=others, sem="relaxed", scope="gpu")
    v1 = tl.where(kk == me, s1, w1.to(tl.int32).to(tl.float32, bitcast=True))
    v2 = tl.where(kk == me, s2, w2.to(tl.int32).to(tl.float32, bitcast=True))
    return tl.sum(tl.where(kk < S, v1, 0.0), axis=0), tl.sum(tl.where(kk < S, v2, 0.0), axis=0)
