"""groupnorm_mish: the Triton GroupNorm + Mish (interpreter) against the reference: the
one-kernel form's one-tile and two-pass paths (its first pass in tiles or flat, ROWS vectors
per thread per step), the split form (partials + apply), the
synchronised form (its two halves as two launches on CPU), ragged channel/pixel tiles and
chunks, broken impls."""
import pytest
import torch
import torch.nn.functional as F

from harness.execute.correctness import check
from harness.registry import Impl, Params, get_op
from kernels.groupnorm_mish import triton_groupnorm_mish as tgm

OP = get_op("groupnorm_mish")


def _p(N, C, H, W, G):
    return Params(N=N, C=C, H=H, W=W, G=G)


def _impl(fn, name="probe", accepts_out=True):
    return Impl(name=name, op=OP.name, fn=fn, backend="triton", accepts_out=accepts_out)


def _alternate(cases):
    """Each case once, in fp16 and bf16 by turns: the kernels' paths do not depend on the
    dtype (only the load/store conversion does), so every path is checked and both dtypes are
    (the suite ran each case in both, at twice the interpreter time)."""
    dtypes = ("float16", "bfloat16")
    return [(*c, dtypes[i % 2]) for i, c in enumerate(cases)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(1, 4, 1, 1, 2), (2, 6, 5, 7, 3), (2, 32, 16, 16, 8),
                                   (1, 12, 100, 1, 4), (3, 20, 3, 3, 1)])
def test_triton(shape, dtype):
    res = check(OP, OP.get_impl("triton"), _p(*shape), dtype, "cpu")
    assert res.correct, res.error


@pytest.mark.parametrize("shape", [(2, 32, 16, 16, 8), (2, 10, 9, 9, 2)])
def test_triton_fp32(shape):
    res = check(OP, OP.get_impl("triton"), _p(*shape), "float32", "cpu")
    assert res.correct, res.error


@pytest.mark.parametrize("shape,config", [
    ((1, 32, 16, 16, 8), (64, 4, 1)),   # two-pass: 4 pixel tiles per channel, walked in reverse
    ((1, 32, 16, 16, 8), (512, 4, 3)),  # two-pass: 2 channels per tile, 2 channel tiles
    ((2, 6, 5, 7, 3), (16, 1, 2)),      # 35 pixels in 3 ragged tiles
    ((1, 30, 4, 4, 3), (64, 2, 4)),     # 10 channels in tiles of 4 (ragged channel tile)
    ((1, 30, 5, 7, 3), (16, 2, 3)),     # ragged in both: 10 channels x 35 pixels in 3 x 3 tiles
])
def test_two_pass_tiles(shape, config):
    cpg, hw = shape[1] // shape[4], shape[2] * shape[3]
    assert not tgm.tile(cpg, hw, config[0])[2]  # really the two-pass path
    impl = _impl(lambda x, w, b, groups, out=None:
                 tgm.groupnorm_mish(x, groups, w, b, out=out, config=config))
    res = check(OP, impl, _p(*shape), "float16", "cpu", trials=1)
    assert res.correct, res.error


# fp32: matches_tiles below
@pytest.mark.parametrize("shape,config,dtype", _alternate([
    ((1, 32, 16, 16, 8), (64, 2, 1, 0, 0, 2)),  # a group of 1024: 2 x 512 per step, 1 step
    ((2, 6, 5, 7, 3), (16, 1, 1, 0, 0, 4)),     # 70 elements: one ragged step (masked tail)
    ((1, 30, 5, 7, 3), (16, 2, 1, 0, 0, 1)),    # 350 elements in steps of 1 x 512 (or 256)
    ((3, 20, 9, 9, 2), (64, 1, 1, 0, 0, 2)),    # 810 in steps of 2 x 256 (fp16): 2 steps
]))
def test_flat_first_pass(shape, config, dtype):
    """ROWS > 0: the first pass reads the group as one flat run of ROWS x COLS per step
    (the group's end read as its first element, adding 0), the second pass as before."""
    cpg, hw = shape[1] // shape[4], shape[2] * shape[3]
    assert not tgm.tile(cpg, hw, config[0])[2]  # the two-pass path
    impl = _impl(lambda x, w, b, groups, out=None:
                 tgm.groupnorm_mish(x, groups, w, b, out=out, config=config))
    res = check(OP, impl, _p(*shape), dtype, "cpu", trials=1)
    assert res.correct, res.error


def test_flat_first_pass_matches_tiles():
    """The flat first pass adds the same shifted values in another order: in fp32 it agrees
    with the tiled one to rounding, also with a mean far from zero (against float64, both are
    1e-6-2.7e-6 off over seeds at 3x20x9x9: the order, not the form, decides which is closer)."""
    x = torch.randn(2, 30, 6, 7) * 3 + 50
    w, b = torch.rand(30) + 0.5, torch.randn(30)
    tiles = tgm.groupnorm_mish(x, 3, w, b, config=(64, 2, 1, 0, 0, 0))
    for rows in (1, 2, 4):
        flat = tgm.groupnorm_mish(x, 3, w, b, config=(64, 2, 1, 0, 0, rows))
        assert torch.allclose(tiles, flat, atol=1e-5, rtol=1e-5)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning",
                            "ignore:invalid value encountered in divide:RuntimeWarning")
def test_mish_extremes_and_large_offsets():
    """Mish at |v| up to 1e4 (overflow guard) and a group mean far from zero (shifted sums)."""
    x = torch.linspace(-3, 3, 2 * 8 * 5 * 5).reshape(2, 8, 5, 5) + 1000.0
    w = torch.full((8,), 3000.0)  # normalised values times 3000: mish sees |v| ~ 5000
    b = torch.zeros(8)
    want = F.mish(F.group_norm(x.double(), 4, w.double(), b.double(), 1e-5))
    torch_err = (F.mish(F.group_norm(x, 4, w, b, 1e-5)).double() - want).abs().max()
    for config in [(256, 4, 1), (16, 1, 3), (16, 1, 1, 2)]:  # one tile, two passes, split
        y = tgm.groupnorm_mish(x, 4, w, b, config=config)
        assert torch.isfinite(y).all()
        # fp32 cannot do much better here (x - mean loses ~17 bits); torch's fp32 error is ~1.4
        assert (y.double() - want).abs().max() <= torch_err


def test_candidates():
    """6-tuples the kernels take; one-tile shapes first (no loop), unpipelined before
    pipelined in the two-pass list, then all again with a flat first pass (ROWS 4) and the
    unpipelined ones with ROWS 2, then the synchronised form (S = the group's tiles,
    2 <= S <= the SMs), then the split form (2+ chunks of whole channels), at most
    MAX_CONFIGS."""
    for cpg, hw in ((10, 4096), (20, 1024), (10, 16384), (2, 35), (8, 64)):
        cands = tgm.configs(cpg, hw, 128, 132)
        assert 1 <= len(cands) <= tgm.MAX_CONFIGS and len(set(cands)) == len(cands)
        assert all(len(c) == 6 for c in cands)
        one = [c for c in cands if c[3] == 0 and tgm.tile(cpg, hw, c[0])[2]]
        assert all(c[2] == 1 for c in one) and cands[:len(one)] == one
        split = [c for c in cands if c[3] and not c[4]]
        assert cands[len(cands) - len(split):] == split  # one kernel first
        assert all(2 <= c[3] <= cpg for c in split)
        two = [c for c in cands if not c[3] and not tgm.tile(cpg, hw, c[0])[2]]
        tiled = [c for c in two if not c[5]]
        assert two == tiled + [(*c[:5], 4) for c in tiled] + \
            [(*c[:5], 2) for c in tiled if c[2] == 1]
        assert not any(c[5] for c in cands if c[4] or tgm.tile(cpg, hw, c[0])[2])
        assert all(c[5] in (0, 4) for c in cands if c[3] and not c[4])
        for block, _, stages, s, sync, _ in cands:
            if sync:
                _, _, nct, nht = tgm.sync_tiles(cpg, hw, block)
                assert stages == 1 and s == nct * nht and 2 <= s <= 64
    sync = {(c[0], c[3]) for c in tgm.configs(10, 4096, 512, 132) if c[4]}
    assert sync == {(4096, 10), (8192, 5), (16384, 3)}  # 1, 2 and 4 channels per program
    assert {c[3] for c in tgm.configs(10, 16384, 32, 132) if c[4]} == {40, 20, 10}
    assert {c[3] for c in tgm.configs(10, 16384, 32, 16) if c[4]} == {10}  # S <= the SMs
    assert {c[2] for c in tgm.configs(10, 4096, 32, 132) if not c[3]} == {1, 3, 4}
    split = {c[3] for c in tgm.configs(10, 4096, 32, 132) if not c[4]}
    assert split == {0, 10, 5, 3}  # 1, 2, 4 channels
    assert {c[3] for c in tgm.configs(10, 16384, 128, 132) if not c[4]} == {0, 10}
    assert not any(c[3] for c in tgm.configs(2, 35, 4, 132))  # one tile: nothing to split
    # enough groups to fill the SMs twice over: no split form (the synchronised one stays)
    assert not any(c[3] and not c[4] for c in tgm.configs(10, 4096, 512, 132))
    assert any(c[3] and not c[4] for c in tgm.configs(10, 4096, 263, 132))


@pytest.mark.parametrize("shape,config,dtype", _alternate([
    ((1, 32, 16, 16, 8), (256, 4, 1, 4)),   # one channel per chunk, one tile each
    ((1, 32, 16, 16, 8), (64, 2, 2, 2)),    # 2 channels per chunk in 8 pipelined tiles
    ((1, 30, 5, 7, 3), (16, 2, 1, 3)),      # chunks of 4, 4, 2 channels x 35 pixels (ragged)
    ((1, 30, 5, 7, 3), (64, 2, 1, 4)),      # 4 chunks asked, 3 kept (no empty chunk)
    ((2, 12, 3, 3, 2), (16, 1, 1, 1)),      # one chunk per group: two kernels all the same
    ((1, 12, 4, 4, 3), (16, 1, 3, 64)),     # more chunks asked than channels: one each
    ((1, 32, 16, 16, 8), (256, 4, 1, 4, 0, 2)),  # partials read flat: 256 per chunk, 1 step
    ((1, 30, 5, 7, 3), (16, 2, 1, 3, 0, 4)),     # flat chunks of 140, 140, 70 (ragged tails)
]))
def test_split_form(shape, config, dtype):
    impl = _impl(lambda x, w, b, groups, out=None:
                 tgm.groupnorm_mish(x, groups, w, b, out=out, config=config))
    res = check(OP, impl, _p(*shape), dtype, "cpu", trials=1)
    assert res.correct, res.error
    assert tgm.kernels_launched() == 2
    tgm.groupnorm_mish(torch.randn(1, 4, 2, 2), 2, torch.ones(4), torch.zeros(4),
                       config=(16, 1, 1, 0))
    assert tgm.kernels_launched() == 1


def test_split_matches_one_kernel():
    """The split form adds the same shifted partial sums: it agrees with the one-kernel form
    to fp32 rounding, and with itself exactly when run again."""
    x = torch.randn(2, 30, 6, 6) * 3 + 50  # a mean far from zero: the shared shift matters
    w, b = torch.rand(30) + 0.5, torch.randn(30)
    one = tgm.groupnorm_mish(x, 3, w, b, config=(64, 2, 2, 0))
    split = tgm.groupnorm_mish(x, 3, w, b, config=(64, 2, 1, 4))
    assert torch.allclose(one, split, atol=1e-5, rtol=1e-5)
    assert torch.equal(split, tgm.groupnorm_mish(x, 3, w, b, config=(64, 2, 1, 4)))


def _sync(shape, block, warps=2):
    cb, hb, nct, nht = tgm.sync_tiles(shape[1] // shape[4], shape[2] * shape[3], block)
    return (block, warps, 1, nct * nht, 1, 0)


@pytest.mark.parametrize("shape,block,dtype", _alternate([
    ((1, 32, 16, 16, 8), 256),   # one channel per program: 4 programs per group
    ((1, 32, 16, 16, 8), 128),   # half a channel: 4 x 2 programs per group
    ((1, 30, 5, 7, 3), 64),      # 10 channels x 35 pixels (ragged pixel tile), 10 programs
    ((2, 12, 3, 3, 2), 64),      # 4 + 2 channels (ragged channel tile), 2 programs
    ((1, 30, 5, 7, 3), 32),      # ragged in both: 10 x 2 programs of 1 x 32
]))
def test_sync_form(shape, block, dtype):
    """S programs per group: on CPU the kernel's halves (publish, then read the group's
    partials back + normalise) as two launches; every tile's two words carry the next epoch."""
    config = _sync(shape, block)
    tgm._words.pop(("cpu", 0, config[3]), None)
    impl = _impl(lambda x, w, b, groups, out=None:
                 tgm.groupnorm_mish(x, groups, w, b, out=out, config=config))
    res = check(OP, impl, _p(*shape), dtype, "cpu", trials=1)
    assert res.correct, res.error
    assert tgm.kernels_launched() == 2
    tiles = shape[0] * shape[4] * config[3]
    epochs = tgm._words[("cpu", 0, config[3])][:2 * tiles] >> 32
    # every launch of the check moved each word on by one, in lockstep
    assert int(epochs[0]) > 0 and (epochs == epochs[0]).all()


def test_sync_one_program_waits_in_kernel():
    """S = 1 runs the whole kernel in one launch, its wait loop included (no other tile to
    wait for), and each call moves the words of its tiles one epoch on."""
    x = torch.randn(3, 12, 3, 3) * 2 + 7
    w, b = torch.rand(12) + 0.5, torch.randn(12)
    config = _sync((3, 12, 3, 3, 2), 128)
    assert config[3] == 1
    tgm._words.pop(("cpu", 0, 1), None)
    y = tgm.groupnorm_mish(x, 2, w, b, config=config)
    assert tgm.kernels_launched() == 1
    assert torch.allclose(y, F.mish(F.group_norm(x, 2, w, b, 1e-5)), atol=1e-5, rtol=1e-5)
    tgm.groupnorm_mish(x, 2, w, b, config=config)
    # 6 groups of 1 tile (2 words each; room for 8 groups), 2 calls
    assert (tgm._words[("cpu", 0, 1)] >> 32).tolist() == [2] * 12 + [0] * 4


def test_exchange_words_hold_value_and_epoch():
    """A word is the partial's fp32 bits below its epoch: what the interpreter's second half
    reads back is exactly the sum the first half stored."""
    x = torch.randn(1, 8, 4, 4) * 3 + 1
    w, b = torch.ones(8), torch.zeros(8)
    config = _sync((1, 8, 4, 4, 2), 32)  # 4 channels x 16 pixels per group: 2 tiles
    assert config[3] == 2
    tgm._words.pop(("cpu", 0, 2), None)
    tgm.groupnorm_mish(x, 2, w, b, config=config)
    words = tgm._words[("cpu", 0, 2)][:8]
    sums = (words & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
    d = (x.view(2, 2, 32) - x.view(2, 64)[:, :1, None]).double()  # shifted by each group's first
    assert torch.allclose(sums.view(2, 2, 2).double(),
                          torch.stack([d.sum(-1), (d * d).sum(-1)], -1), rtol=1e-5, atol=1e-4)
    assert (words >> 32).tolist() == [1] * 8


def test_sync_matches_other_forms():
    """The synchronised form adds the same shifted partials as the split form (fixed order):
    it agrees with the one-kernel form to fp32 rounding and with itself exactly."""
    x = torch.randn(2, 30, 6, 6) * 3 + 50
    w, b = torch.rand(30) + 0.5, torch.randn(30)
    one = tgm.groupnorm_mish(x, 3, w, b, config=(64, 2, 2, 0))
    sync = tgm.groupnorm_mish(x, 3, w, b, config=_sync((2, 30, 6, 6, 3), 64))
    assert torch.allclose(one, sync, atol=1e-5, rtol=1e-5)
    assert torch.equal(sync, tgm.groupnorm_mish(x, 3, w, b, config=_sync((2, 30, 6, 6, 3), 64)))


def test_sync_config_checked():
    """A SPLIT that is not the group's tile count for BLOCK is refused, naming the right
    one (the kernel would wait for programs that never come)."""
    x, w, b = torch.randn(1, 8, 4, 4), torch.ones(8), torch.zeros(8)
    with pytest.raises(ValueError, match="SPLIT must be 4, not 3"):
        tgm.groupnorm_mish(x, 2, w, b, config=(16, 1, 1, 3, 1))


def test_torch_peer():
    res = check(OP, OP.get_impl("torch"), _p(2, 8, 4, 4, 2), "float16", "cpu")
    assert res.correct, res.error


def test_wrong_groups_fail():
    impl = _impl(lambda x, w, b, groups, out=None: tgm.groupnorm_mish(x, 1, w, b, out=out),
                 "one_group")
    res = check(OP, impl, _p(2, 8, 4, 4, 4), "float16", "cpu", trials=1)
    assert not res.correct


def test_last_group_missing_fails():
    def broken(x, w, b, groups, out=None):  # the last sample is never written
        tgm.groupnorm_mish(x[:-1], groups, w, b, out=out[:-1])
        return out

    res = check(OP, _impl(broken, "short"), _p(2, 8, 4, 4, 4), "float16", "cpu", trials=1)
    assert not res.correct and "never written" in res.error


def test_validation_and_counts():
    with pytest.raises(ValueError, match="divisible"):
        tgm.groupnorm_mish(torch.zeros(1, 6, 2, 2), 4, torch.ones(6), torch.zeros(6))
    p = _p(2, 8, 3, 5, 4)
    inputs = OP.make_inputs(p, torch.float16, "cpu", torch.Generator().manual_seed(0))
    out = OP.make_out(inputs, p)
    assert OP.byte_count(p, 2) == sum(t.numel() * 2 for t in (*inputs, out))
