"""add_layernorm: the fused residual-add + LayerNorm Triton kernel (interpreter) against the
reference (h and y both checked, both NaN-poisoned), awkward shapes, broken impls."""
import pytest
import torch

from harness.execute.correctness import check
from harness.registry import Impl, Params, get_op
from kernels.layernorm import triton_layernorm as tln

OP = get_op("add_layernorm")


def _impl(fn, name="probe", accepts_out=True):
    return Impl(name=name, op=OP.name, fn=fn, backend="triton", accepts_out=accepts_out)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("M,N", [(1, 1), (1, 100), (37, 1000), (4, 3000)])
def test_triton(M, N, dtype):
    res = check(OP, OP.get_impl("triton"), Params(M=M, N=N), dtype, "cpu", trials=1)
    assert res.correct, res.error


@pytest.mark.parametrize("config", [(2, 4, 0, 1), (4, 1, 0, 1), (2, 4, 1, 3)])
def test_rows_per_program(config):
    def fn(x, r, w, b, out=None):
        return tln.layernorm_fwd(x, w, b, residual=r, out=out[1], h_out=out[0], config=config)

    res = check(OP, _impl(fn), Params(M=9, N=200), "float16", "cpu")
    assert res.correct, res.error


def test_long_rows_looped(monkeypatch):
    monkeypatch.setattr(tln, "MAX_FUSED", 64)
    monkeypatch.setattr(tln, "LOOP_BLOCK", 32)
    res = check(OP, OP.get_impl("triton"), Params(M=3, N=150), "bfloat16", "cpu")
    assert res.correct, res.error


def test_torch_peer():
    res = check(OP, OP.get_impl("torch"), Params(M=5, N=64), "float16", "cpu")
    assert res.correct, res.error


def test_writes_into_the_given_buffer():
    g = torch.Generator().manual_seed(0)
    p = Params(M=3, N=20)
    inputs = OP.make_inputs(p, torch.float16, "cpu", g)
    out = OP.make_out(inputs, p)
    h, y = OP.bind_impl(OP.get_impl("triton"), inputs, p, out)()
    assert h.data_ptr() == out[0].data_ptr() and y.data_ptr() == out[1].data_ptr()
    torch.testing.assert_close(h, inputs[0] + inputs[1])


def test_h_never_written_fails():
    def broken(x, r, w, b, out=None):  # computes y only: h (out[0]) keeps its NaN poison
        y = tln.layernorm_fwd(x + r, w, b, out=out[1])
        return out[0], y

    res = check(OP, _impl(broken, "no_h"), Params(M=4, N=50), "float16", "cpu", trials=1)
    assert not res.correct and "output 0" in res.error and "never written" in res.error


def test_residual_ignored_fails():
    def broken(x, r, w, b, out=None):  # normalises x instead of x + residual
        y = tln.layernorm_fwd(x, w, b, out=out[1])
        out[0].copy_(x + r)
        return out[0], y

    res = check(OP, _impl(broken, "no_res"), Params(M=4, N=50), "float16", "cpu", trials=1)
    assert not res.correct and "output 1" in res.error


def test_counts_are_the_tensors_moved():
    p = Params(M=8, N=40)
    inputs = OP.make_inputs(p, torch.bfloat16, "cpu", torch.Generator().manual_seed(0))
    out = OP.make_out(inputs, p)
    assert OP.byte_count(p, 2) == sum(t.numel() * 2 for t in (*inputs, out))
