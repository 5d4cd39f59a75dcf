"""The correctness check must fail wrong kernels: zeros, NaN, unwritten elements, off-by-one."""
import math

import pytest
import torch
import triton
import triton.language as tl

from harness.execute.correctness import check, compare
from harness.registry import Params, registry

import harness_test_ops  # noqa: F401  (registers the self-test op `scale2`)

OP = harness_test_ops.op


@pytest.mark.parametrize("impl, ok, reason", [
    ("torch", True, None),
    ("zeros", False, "max abs error"),
    ("nan", False, "1000 of 1000 elements are NaN"),
    ("off_by_one", False, "1 of 1000 elements are NaN"),
])
def test_scale2_impls(impl, ok, reason):
    res = check(OP, OP.get_impl(impl), Params(N=1000), "float32", "cpu", trials=2, seed=1)
    assert res.correct is ok, res
    if reason:
        assert reason in res.error
    else:
        assert res.error is None and res.trials == 2


@triton.jit
def _softmax_off_by_one(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    # bug: the load mask drops the last column from max and sum
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols - 1, other=-float("inf"))
    e = tl.exp(x.to(tl.float32) - tl.max(x.to(tl.float32), 0))
    tl.store(y_ptr + row * n_cols + cols, (e / tl.sum(e, 0)).to(tl.float16), mask=cols < n_cols)


def test_triton_kernel_with_an_off_by_one_mask_fails():
    op = registry().get_op("softmax")

    def buggy(x, out=None):
        _softmax_off_by_one[(x.shape[0],)](x, out, x.shape[1],
                                           BLOCK=triton.next_power_of_2(x.shape[1]))
        return out

    from harness.registry import Impl

    impl = Impl("buggy", "softmax", buggy, "triton", accepts_out=True)
    res = check(op, impl, Params(M=3, N=37), "float16", "cpu", trials=1)
    assert not res.correct and "max abs error" in res.error
    good = check(op, op.get_impl("triton"), Params(M=3, N=37), "float16", "cpu", trials=1)
    assert good.correct, good


def test_tolerance_is_tied_to_torchs_own_error():
    ref = torch.linspace(-1, 1, 101, dtype=torch.float32)
    lo = ref.half()  # torch's own fp16 result: off by at most half an ulp
    torch_err = float((lo.float() - ref).abs().max())
    ulp = 2.0 ** -10  # fp16 ulp at |x| in [1, 2): tol = 2 x torch_err + 1 ulp (~2 ulp)
    figures, reason = compare(lo, ref, lo, torch.float16, 2.0)
    assert reason is None and figures["torch_err"] == pytest.approx(torch_err)
    assert figures["tol"] == pytest.approx(2 * torch_err + ulp * 1.0)
    _, reason = compare((ref + ulp).half(), ref, lo, torch.float16, 2.0)
    assert reason is None  # one ulp off: accepted
    _, reason = compare((ref + 4 * ulp).half(), ref, lo, torch.float16, 2.0)
    assert reason is not None and "tolerance" in reason


def test_shape_mismatch_fails():
    _, reason = compare(torch.zeros(3), torch.zeros(4), torch.zeros(4), torch.float32, 2.0)
    assert "shape" in reason


def test_every_registered_triton_impl_is_correct_on_the_smoke_sweep():
    """All committed experiments' Triton candidates pass on their smoke cases (interpreter)."""
    from pathlib import Path

    from harness.experiment import spec

    root = Path(__file__).resolve().parent.parent
    exp = spec.load(root / "experiments" / "softmax.yaml")
    op = registry().get_op(exp.op)
    for case in spec.expand(exp, smoke=True):
        if op.get_impl(case.impl).backend != "triton":
            continue
        res = check(op, op.get_impl(case.impl), Params(case.params_dict), case.dtype, "cpu",
                    trials=1)
        assert res.correct, (case.case_id, res.error)


def test_reference_is_computed_once_per_shape_and_trial_and_shared_by_impls(monkeypatch):
    from harness.execute import correctness

    calls = []
    real = OP.run_reference
    monkeypatch.setattr(OP, "run_reference", lambda inputs, p: calls.append(1) or real(inputs, p))
    cache = correctness.ReferenceCache()
    for impl in ("torch", "zeros", "torch"):
        check(OP, OP.get_impl(impl), Params(N=64), "float32", "cpu", trials=2, seed=5,
              cache=cache)
    # 2 trials x (same-dtype + high-precision) references, once for all three implementations
    assert len(calls) == 4 and cache.hits >= 3
    # a new shape (or seed) computes afresh
    check(OP, OP.get_impl("torch"), Params(N=65), "float32", "cpu", trials=2, seed=5,
          cache=cache)
    assert len(calls) == 8


def test_cached_reference_still_fails_a_wrong_impl_and_ignores_input_writes():
    from harness.execute import correctness
    from harness.registry import Impl

    def clobber(x):  # writes into its input, then returns the right answer for the new values
        x.mul_(0)
        return x * 2

    cache = correctness.ReferenceCache()
    good = check(OP, OP.get_impl("torch"), Params(N=100), "float32", "cpu", seed=3, cache=cache)
    bad = check(OP, Impl("clobber", "scale2", clobber, "torch"), Params(N=100), "float32", "cpu",
                seed=3, cache=cache)
    assert good.correct and not bad.correct and "max abs error" in bad.error
    zeros = check(OP, OP.get_impl("zeros"), Params(N=100), "float32", "cpu", seed=3, cache=cache)
    assert not zeros.correct


def test_figures_count_only_where_the_reference_is_finite():
    """Where the reference is not finite (a fully masked softmax row, say), the output may be
    anything; elsewhere a NaN is an unwritten element, an inf a non-finite one, and the error,
    the reference's size and the relative error are taken over the finite elements only."""
    ref = torch.tensor([1.0, -2.0, float("nan"), float("inf"), 4.0])
    out = torch.tensor([1.0, -2.5, 7.0, float("nan"), 4.0])
    figures, reason = compare(out, ref, ref, torch.float32, 2.0)
    assert "tolerance" in reason  # 0.5 off at -2.0
    assert figures["max_abs_err"] == pytest.approx(0.5) and figures["torch_err"] == 0.0
    assert figures["tol"] == pytest.approx(2.0 ** -23 * 4.0)  # |ref| at most 4 where finite
    assert figures["rel_err"] == pytest.approx(0.5 / math.sqrt(1 + 4 + 16))
    nan = out.clone()
    nan[0] = float("nan")
    figures, reason = compare(nan, ref, ref, torch.float32, 2.0)
    assert "1 of 5 elements are NaN" in reason and figures["max_abs_err"] == math.inf
    inf = out.clone()
    inf[4] = float("inf")
    figures, reason = compare(inf, ref, ref, torch.float32, 2.0)
    assert "1 non-finite elements" in reason and figures["rel_err"] == math.inf
    # a non-finite output is infinitely wrong, even where the reference's norm overflows
    huge = torch.tensor([1e200, 1.0], dtype=torch.float64)
    figures, _ = compare(torch.tensor([float("inf"), 1.0], dtype=torch.float64), huge, huge,
                         torch.float32, 2.0)
    assert figures["rel_err"] == math.inf and figures["max_abs_err"] == math.inf
    assert compare(torch.zeros(0), torch.zeros(0), torch.zeros(0), torch.float32, 2.0) == (
        {"max_abs_err": 0.0, "rel_err": 0.0, "tol": 2.0 ** -23 * 1e-30, "torch_err": 0.0}, None)
