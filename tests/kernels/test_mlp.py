"""mlp: the two-kernel and the fully fused Triton MLPs (interpreter) against the reference
under the harness's tolerance rule; ragged M/H, configs, the D limit, a broken impl."""
import pytest
import torch

from harness.execute.correctness import check
from harness.registry import Impl, Params, get_op
from kernels.mlp import triton_mlp

OP = get_op("mlp")


def _p(M, D, H, approximate="none"):
    return Params(M=M, D=D, H=H, approximate=approximate)


def _impl(fn, name="probe"):
    return Impl(name=name, op=OP.name, fn=fn, backend="triton", accepts_out=True)


@pytest.mark.parametrize("impl", ["triton", "triton_fused"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("M,D,H,approximate", [(1, 16, 16, "none"), (37, 40, 70, "tanh"),
                                               (100, 128, 300, "none")])
def test_triton(impl, M, D, H, approximate, dtype):
    res = check(OP, OP.get_impl(impl), _p(M, D, H, approximate), dtype, "cpu", trials=1)
    assert res.correct, res.error


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("M,D,H,approximate", [(1, 16, 16, "none"), (37, 40, 72, "tanh"),
                                               (100, 128, 296, "none")])
def test_triton_tma(M, D, H, approximate, dtype):
    """Both matmuls through TMA descriptors (H, D multiples of 8; M and the tiles ragged)."""
    res = check(OP, OP.get_impl("triton_tma"), _p(M, D, H, approximate), dtype, "cpu", trials=1)
    assert res.correct, res.error


def test_triton_tma_stride_rule():
    impl = OP.get_impl("triton_tma")
    assert "H=70" in impl.reason_unavailable(_p(37, 40, 70), "float16", "cuda")
    assert "D=36" in impl.reason_unavailable(_p(37, 36, 64), "float16", "cuda")
    assert impl.reason_unavailable(_p(8, 4096, 11008), "bfloat16", "cuda") is None


@pytest.mark.parametrize("config", triton_mlp.FUSED_CONFIGS)
def test_fused_configs(config):
    """Ragged rows (M % BLOCK_M != 0) and hidden chunks (H % BLOCK_H != 0)."""
    impl = _impl(lambda x, w1, b1, w2, b2, approximate="none", out=None:
                 triton_mlp.mlp_fused(x, w1, b1, w2, b2, out=out, config=config))
    res = check(OP, impl, _p(70, 24, 100), "float16", "cpu", trials=1)
    assert res.correct, res.error


def test_fused_widest():
    res = check(OP, OP.get_impl("triton_fused"), _p(20, triton_mlp.MAX_FUSED_D, 40), "float16",
                "cpu", trials=1)
    assert res.correct, res.error


def test_fused_width_limit():
    impl = OP.get_impl("triton_fused")
    assert impl.reason_unavailable(_p(8, 4096, 64), "float16", "cuda")
    assert impl.reason_unavailable(_p(8, 256, 64), "float16", "cuda") is None
    x = torch.zeros(2, 512)
    w1, b1, w2, b2 = torch.zeros(8, 512), torch.zeros(8), torch.zeros(512, 8), torch.zeros(512)
    with pytest.raises(ValueError, match="D <="):
        triton_mlp.mlp_fused(x, w1, b1, w2, b2)


def test_torch_peer():
    res = check(OP, OP.get_impl("torch"), _p(9, 32, 48), "float16", "cpu")
    assert res.correct, res.error


def test_hidden_unit_dropped_fails():
    def broken(x, w1, b1, w2, b2, approximate="none", out=None):  # H loop one unit short
        return triton_mlp.mlp_fused(x, w1[:-1], b1[:-1], w2[:, :-1].contiguous(), b2, out=out)

    res = check(OP, _impl(broken, "short_h"), _p(40, 32, 33), "float16", "cpu", trials=1)
    assert not res.correct


def test_counts():
    p = _p(64, 32, 128)
    assert OP.flop_count(p) == 4 * 64 * 32 * 128 + 2 * 64 * 128 + 64 * 32
    inputs = OP.make_inputs(p, torch.float16, "cpu", torch.Generator().manual_seed(0))
    out = OP.make_out(inputs, p)
    # the floor: every input read once and the output written once; h never reaches HBM
    assert OP.byte_count(p, 2) == sum(t.numel() * 2 for t in (*inputs, out))
