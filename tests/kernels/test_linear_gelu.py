"""linear_gelu: the Triton matmul with bias + GELU epilogue (interpreter) against the reference
under the harness's tolerance rule; ragged tiles, every config, extreme inputs, broken impls."""
import pytest
import torch
import torch.nn.functional as F

from harness.execute.correctness import check
from harness.registry import Impl, Params, get_op
from kernels.linear_gelu import triton_matmul as tm

OP = get_op("linear_gelu")


def _p(M, K, N, approximate="none"):
    return Params(M=M, K=K, N=N, approximate=approximate)


def _impl(fn, name="probe"):
    return Impl(name=name, op=OP.name, fn=fn, backend="triton", accepts_out=True)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("M,K,N", [(1, 16, 16), (37, 50, 70), (130, 128, 300)])
def test_triton(M, K, N, dtype, approximate):
    res = check(OP, OP.get_impl("triton"), _p(M, K, N, approximate), dtype, "cpu", trials=1)
    assert res.correct, res.error


@pytest.mark.parametrize("config", tm.CONFIGS, ids=lambda c: c.label().replace(" ", "_"))
def test_every_config_ragged(config):
    """M, N not multiples of the tile, K not a multiple of BLOCK_K (masked K loop)."""
    impl = _impl(lambda x, w, b, approximate="none", out=None:
                 tm.matmul_bias_act(x, w, b, act="gelu", out=out, config=config))
    res = check(OP, impl, _p(130, 72, 260), "float16", "cpu", trials=1)
    assert res.correct, res.error


def test_grouped_order_covers_every_tile():
    """More row-tiles than GROUP_M and a ragged last group: every output tile is written."""
    cfg = tm.MatmulConfig(16, 16, 16, 4, 1, 1)
    impl = _impl(lambda x, w, b, approximate="none", out=None:
                 tm.matmul_bias_act(x, w, b, act="gelu", out=out, config=cfg))
    res = check(OP, impl, _p(100, 32, 50), "bfloat16", "cpu", trials=1)
    assert res.correct, res.error


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("act,approximate", [("gelu", "none"), ("gelu_tanh", "tanh")])
def test_gelu_at_extremes(act, approximate):
    """Pre-activations from -1e4 to 1e4 (exp overflow must give -0, not NaN)."""
    a = torch.linspace(-1e4, 1e4, 64 * 16).reshape(64, 16)
    w = torch.eye(16)
    b = torch.linspace(-1, 1, 16)
    got = tm.matmul_bias_act(a, w, b, act=act)
    want = F.gelu(a.double() + b.double(), approximate=approximate).float()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_no_activation_and_no_bias():
    a, w = torch.randn(20, 24), torch.randn(12, 24)
    torch.testing.assert_close(tm.matmul_bias_act(a, w), a @ w.T, rtol=1e-4, atol=1e-4)


def test_torch_peer():
    res = check(OP, OP.get_impl("torch"), _p(8, 32, 16, "tanh"), "float16", "cpu")
    assert res.correct, res.error


def test_bias_dropped_fails():
    impl = _impl(lambda x, w, b, approximate="none", out=None:
                 tm.matmul_bias_act(x, w, None, act="gelu", out=out), "no_bias")
    res = check(OP, impl, _p(33, 40, 50), "float16", "cpu", trials=1)
    assert not res.correct


def test_last_k_block_dropped_fails():
    def broken(x, w, b, approximate="none", out=None):  # K loop one block short
        return tm.matmul_bias_act(x[:, :-16].contiguous(), w[:, :-16].contiguous(), b,
                                  act="gelu", out=out)

    res = check(OP, _impl(broken, "short_k"), _p(33, 80, 50), "float16", "cpu", trials=1)
    assert not res.correct


def test_validation_and_counts():
    with pytest.raises(ValueError, match="act must be"):
        tm.matmul_bias_act(torch.zeros(2, 2), torch.zeros(2, 2), act="relu")
    with pytest.raises(ValueError, match="expected a"):
        tm.matmul_bias_act(torch.zeros(2, 3), torch.zeros(2, 2))
    p = _p(8, 32, 16)
    assert OP.flop_count(p) == 2 * 8 * 16 * 32 + 2 * 8 * 16
    inputs = OP.make_inputs(p, torch.float16, "cpu", torch.Generator().manual_seed(0))
    out = OP.make_out(inputs, p)
    assert OP.byte_count(p, 2) == sum(t.numel() * 2 for t in (*inputs, out))
