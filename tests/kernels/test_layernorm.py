"""layernorm: forward and backward Triton kernels (interpreter) against the reference under
the harness's tolerance rule, awkward shapes, forced launch configurations, broken impls."""
import pytest
import torch
import triton
import torch.nn.functional as F

from harness.execute.correctness import check
from harness.registry import Impl, Params, get_op
from kernels.layernorm import triton_layernorm as tln
from kernels.layernorm import triton_layernorm_bwd as tlb

OP = get_op("layernorm")


def _p(M, N, mode="fwd"):
    return Params(M=M, N=N, mode=mode)


def _impl(fn, name="probe", accepts_out=True):
    return Impl(name=name, op=OP.name, fn=fn, backend="triton", accepts_out=accepts_out)


# -- forward -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("M,N", [(1, 1), (1, 7), (5, 100), (33, 1000), (3, 2048), (7, 80),
                                 (9, 600), (4, 1280)])
def test_forward(M, N, dtype):
    res = check(OP, OP.get_impl("triton"), _p(M, N), dtype, "cpu", trials=1)
    assert res.correct, res.error


@pytest.mark.parametrize("config", [(1, 1, 0, 1), (2, 4, 0, 1), (4, 1, 0, 1), (8, 2, 0, 1),
                                    (1, 4, 1, 3), (2, 4, 2, 2), (4, 1, 1, 4)])
def test_forward_rows_per_program(config):
    # M = 10 is not a multiple of ROWS: the last tile has masked rows; per_sm > 0: the
    # persistent kernel, 4 "SMs" in the interpreter, so a program walks several tiles
    impl = _impl(lambda x, w, b, out=None: tln.layernorm_fwd(x, w, b, out=out, config=config))
    res = check(OP, impl, _p(10, 300), "float16", "cpu")
    assert res.correct, res.error


def test_row_segments():
    """A width is one power-of-two block, or two segments (a power of two below N and the
    next power of two of the rest) where those cover fewer lanes; every column covered."""
    assert tln.segments(4096) == (4096, 0) and tln.segments(1) == (1, 0)
    assert tln.segments(5120) == (4096, 1024)  # 8192 lanes would mask 3072
    assert tln.segments(11008) == (8192, 4096)
    assert tln.segments(1000) == (1024, 0) and tln.segments(100) == (128, 0)  # 512 + 512
    for n in range(1, 2049):
        block, tail = tln.segments(n)
        assert block & (block - 1) == 0 and tail & (tail - 1) == 0
        assert block + tail >= n and block + tail <= triton.next_power_of_2(n)
        assert tail == 0 or (block < n and tail < block)


@pytest.mark.parametrize("config", [(2, 4, 0, 1), (1, 2, 2, 2)])
def test_forward_two_segments_with_residual(config):
    """add_layernorm over two segments (5 x 2^k wide): h and y both right, rows and
    persistent kernels."""
    x, r = torch.randn(6, 320), torch.randn(6, 320)
    w, b = torch.randn(320), torch.randn(320)
    h, y = tln.layernorm_fwd(x, w, b, residual=r, config=config)
    torch.testing.assert_close(h, x + r)
    torch.testing.assert_close(y, F.layer_norm(x + r, (320,), w, b, 1e-5), atol=1e-5, rtol=1e-5)


def test_forward_configs_are_sane():
    for M, N, item in [(16384, 1024, 2), (8192, 5120, 2), (4096, 16384, 4), (1, 3, 2)]:
        cands = tln.configs(M, N, item)
        assert cands and len(set(cands)) == len(cands) and cands[0][2:] == (0, 1)
        for rows, warps, per_sm, stages in cands:
            assert rows <= max(1, M) and warps in (1, 2, 4, 8, 16)
            assert (per_sm == 0) == (stages == 1) or per_sm > 0
            block = 1 << (N - 1).bit_length()
            assert per_sm * (stages - 1) * rows * block * item <= tln.SMEM_BUDGET
    # the benchmark shapes get persistent candidates; 64 KiB fp32 row tiles do not fit
    assert any(c[2] > 0 for c in tln.configs(16384, 1024, 2))
    assert any(c[2] > 0 for c in tln.configs(8192, 4096, 2))
    assert not any(c[2] > 0 for c in tln.configs(4096, 16384, 4))
    with pytest.raises(ValueError, match="STAGES > 1 needs per_sm > 0"):
        x = torch.zeros(4, 8)
        tln.layernorm_fwd(x, torch.ones(8), torch.zeros(8), config=(1, 1, 0, 2))


@pytest.mark.parametrize("N", [100, 129])
def test_forward_long_rows_looped(monkeypatch, N):
    """Rows wider than MAX_FUSED go through the two-pass chunked kernel (ragged last chunk)."""
    monkeypatch.setattr(tln, "MAX_FUSED", 64)
    monkeypatch.setattr(tln, "LOOP_BLOCK", 32)
    res = check(OP, OP.get_impl("triton"), _p(3, N), "float16", "cpu")
    assert res.correct, res.error


def test_forward_stats_match_torch():
    x = torch.randn(6, 50) * 3 + 1
    w, b = torch.ones(50), torch.zeros(50)
    _, mean, rstd = tln.layernorm_fwd(x, w, b, stats=True)
    torch.testing.assert_close(mean, x.mean(1))
    torch.testing.assert_close(rstd, 1 / torch.sqrt(x.var(1, unbiased=False) + 1e-5))


def test_forward_last_row_missing_fails():
    def broken(x, w, b, out=None):  # off by one row: the last row is never written
        tln.layernorm_fwd(x[:-1], w, b, out=out[:-1])
        return out

    res = check(OP, _impl(broken, "broken"), _p(7, 100), "float16", "cpu", trials=1)
    assert not res.correct and "never written" in res.error


def test_forward_biased_variance_matters():
    def broken(x, w, b, out=None):  # unbiased variance instead of LayerNorm's biased one
        xf = x.float()
        y = (xf - xf.mean(1, keepdim=True)) / torch.sqrt(xf.var(1, keepdim=True) + 1e-5)
        return (y * w.float() + b.float()).to(x.dtype)

    res = check(OP, _impl(broken, "unbiased", accepts_out=False), _p(4, 40), "float16", "cpu",
                trials=1)
    assert not res.correct


# -- backward ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("M,N", [(1, 7), (5, 100), (37, 300)])
def test_backward(M, N, dtype):
    res = check(OP, OP.get_impl("triton"), _p(M, N, "bwd"), dtype, "cpu", trials=1)
    assert res.correct, res.error


@pytest.mark.parametrize("config", [(1, 2, 4, 1), (4, 4, 4, 1), (2, 1, 1, 1), (1, 4, 4, 3),
                                    (2, 2, 4, 2)])
def test_backward_configs(config):
    """Programs per SM (partials), rows per iteration (ragged), warps, pipelined row loop."""
    impl = _impl(lambda x, w, b: tlb.layernorm(x, w, b, bwd_config=config), "cfg",
                 accepts_out=False)
    res = check(OP, impl, _p(23, 130, "bwd"), "float16", "cpu", trials=1)
    assert res.correct, res.error


def test_backward_candidates():
    """Every candidate is a 4-tuple the kernel takes; the unpipelined ones come first and the
    pipelined ones stay within the shared-memory budget."""
    for M, N in ((16384, 1024), (8192, 4096), (37, 300)):
        cands = tlb.configs(M, N, 2)
        assert cands[0][3] == 1 and len(set(cands)) == len(cands)
        assert {1, 2, 3} <= {c[3] for c in cands} <= set(range(1, 9))
        for per_sm, rows, _, stages in cands:
            block = 1 << (N - 1).bit_length()
            assert stages == 1 or per_sm * 2 * stages * rows * block * 2 <= tlb.SMEM_BUDGET


def test_column_sum_strips_give_every_sm_a_program_and_cover_all_partials():
    """The dw/db column sum: about one strip per SM, strips of whole 32-byte sectors (>= 8
    fp32 columns), a partial-row tile that is a power of two; ragged P and N summed right."""
    for P, N, sms in ((256, 1024, 132), (264, 4096, 132), (4, 130, 4), (12, 300, 4),
                      (1, 7, 132), (264, 16384, 132)):
        bp, bc = tlb.colsum_tiles(P, N, sms)
        assert 8 <= bc <= 64 and bc & (bc - 1) == 0 and bp & (bp - 1) == 0
        assert -(-N // bc) >= min(sms // 2, N // 64)  # never fewer strips than needed
    assert tlb.colsum_tiles(256, 1024, 132) == (256, 8)  # 128 programs, not 16
    g = torch.Generator().manual_seed(1)
    for P, N in ((37, 300), (5, 7)):
        dwp, dbp = torch.randn(P, N, generator=g), torch.randn(P, N, generator=g)
        dw, db = torch.empty(N), torch.empty(N)
        bp, bc = tlb.colsum_tiles(P, N, 4)
        tlb._ln_bwd_colsum[(-(-N // bc),)](dwp, dbp, dw, db, P, N, BLOCK_P=bp, BLOCK_C=bc,
                                           PDL=False)
        torch.testing.assert_close(dw, dwp.sum(0))
        torch.testing.assert_close(db, dbp.sum(0))


def test_backward_torch_peer():
    res = check(OP, OP.get_impl("torch"), _p(9, 64, "bwd"), "float16", "cpu")
    assert res.correct, res.error


def test_backward_returns_three_grads_in_input_dtype():
    g = torch.Generator().manual_seed(0)
    inputs = OP.make_inputs(_p(4, 33, "bwd"), torch.bfloat16, "cpu", g)
    grads = OP.bind_impl(OP.get_impl("triton"), inputs, _p(4, 33, "bwd"))()
    assert [tuple(t.shape) for t in grads] == [(4, 33), (33,), (33,)]
    assert all(t.dtype == torch.bfloat16 for t in grads)


def test_backward_dropped_row_fails():
    def broken(x, w, b):  # the last row's gradient does not flow: dx row 0, dw/db short a row
        y = tlb.layernorm(x, w, b)
        return torch.cat([y[:-1], y[-1:].detach()])

    res = check(OP, _impl(broken, "drop_row", accepts_out=False), _p(6, 50, "bwd"), "float16",
                "cpu", trials=1)
    assert not res.correct


def test_backward_width_limit():
    impl = OP.get_impl("triton")
    assert impl.reason_unavailable(_p(8, tlb.MAX_BWD + 1, "bwd"), "float16", "cuda")
    assert impl.reason_unavailable(_p(8, tlb.MAX_BWD + 1, "fwd"), "float16", "cuda") is None
    x = torch.zeros(2, tlb.MAX_BWD + 1)
    m = torch.zeros(2)
    with pytest.raises(ValueError, match="N <="):
        tlb.layernorm_bwd(x, x, torch.ones(x.shape[1]), m, m)


def test_counts():
    p = _p(16, 64)
    assert OP.byte_count(p, 2) == (2 * 16 * 64 + 2 * 64) * 2
    assert OP.byte_count(_p(16, 64, "bwd"), 2) == (3 * 16 * 64 + 3 * 64) * 2
    # the forward floor is exactly the inputs read plus the output written
    inputs = OP.make_inputs(p, torch.float16, "cpu", torch.Generator().manual_seed(0))
    out = OP.make_out(inputs, p)
    assert OP.byte_count(p, 2) == sum(t.numel() * 2 for t in (*inputs, out))
    assert OP.make_out(OP.make_inputs(_p(2, 8, "bwd"), torch.float16, "cpu",
                                      torch.Generator().manual_seed(0)), _p(2, 8, "bwd")) is None


def test_gradients_match_torch_autograd_fp32():
    torch.manual_seed(0)
    x = torch.randn(12, 80, dtype=torch.float64).float().requires_grad_()
    w = (1 + 0.1 * torch.randn(80)).requires_grad_()
    b = (0.1 * torch.randn(80)).requires_grad_()
    dy = torch.randn(12, 80)
    got = torch.autograd.grad(tlb.layernorm(x, w, b), (x, w, b), dy)
    want = torch.autograd.grad(F.layer_norm(x, (80,), w, b, 1e-5), (x, w, b), dy)
    for g_, w_ in zip(got, want):
        torch.testing.assert_close(g_, w_, rtol=1e-4, atol=1e-5)
