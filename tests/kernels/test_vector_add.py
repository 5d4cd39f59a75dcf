"""vector_add: the Triton kernel (interpreter) against the reference, under the harness's
tolerance rule; every launch configuration; a broken kernel that must fail."""
import pytest
import torch
import triton
import triton.language as tl

from harness.execute.correctness import check
from harness.registry import Impl, Params, get_op
from kernels.vector_add import triton_vector_add as tva

OP = get_op("vector_add")


def _impl(fn, name="probe"):
    return Impl(name=name, op=OP.name, fn=fn, backend="triton", accepts_out=True)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("n", [1, 7, 4096, 4097, 70001])
def test_triton_matches_reference(n, dtype):
    res = check(OP, OP.get_impl("triton"), Params(N=n), dtype, "cpu")
    assert res.correct, res.error


@pytest.mark.parametrize("config", tva.CONFIGS)
@pytest.mark.parametrize("n", [16384, 10001])  # a multiple of every BLOCK (EVEN), and ragged
def test_every_config(config, n):
    impl = _impl(lambda x, y, out=None: tva.vector_add(x, y, out=out, config=config))
    res = check(OP, impl, Params(N=n), "float16", "cpu", trials=1)
    assert res.correct, res.error


def test_torch_peer_and_counts():
    res = check(OP, OP.get_impl("torch"), Params(N=1000), "float16", "cpu")
    assert res.correct, res.error
    p = Params(N=1000)
    assert OP.byte_count(p, 2) == 3 * 1000 * 2
    assert OP.flop_count(p) == 1000


@triton.jit
def _add_off_by_one(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n - 1  # the bug: the last element is never written
    tl.store(z_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)


def test_off_by_one_mask_fails():
    def broken(x, y, out=None):
        _add_off_by_one[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
        return out

    res = check(OP, _impl(broken, "off_by_one"), Params(N=3000), "float16", "cpu", trials=1)
    assert not res.correct
    assert "never written" in res.error


def test_wrong_values_fail():
    res = check(OP, _impl(lambda x, y, out=None: torch.sub(x, y, out=out), "sub"),
                Params(N=3000), "float16", "cpu", trials=1)
    assert not res.correct and "tolerance" in res.error


def test_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="1-D"):
        tva.vector_add(torch.zeros(4), torch.zeros(5))
    with pytest.raises(ValueError, match="one dtype"):
        tva.vector_add(torch.zeros(4), torch.zeros(4, dtype=torch.float16))
