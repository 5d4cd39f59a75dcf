"""Op `attention`: references, Triton kernels (CPU interpreter), binder, availability, specs.

Shapes are small (the interpreter is slow) but awkward: N not a multiple of any block size,
several query and key tiles, causal diagonal bands, one-row sequences.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import store

from harness.experiment import spec
from harness.execute.correctness import check, compare
from harness.registry import Impl, Params, get_op
from kernels.attention import flash_bwd, flash_fwd, peers
from kernels.attention import reference as ref
from kernels.attention.flash import flash_attention
from kernels.attention.fused_mha import fused_mha

ROOT = Path(__file__).resolve().parents[2]
OP = get_op("attention")
LOG2E = 1.4426950408889634


def _qkv(B, H, N, D, dtype, seed=0, n=3):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, N, D, generator=g).to(dtype) for _ in range(n))


def _params(**kw):
    base = dict(B=1, H=2, N=100, D=16, causal=False, mode="fwd")
    base.update(kw)
    return Params(base)


def _backward_within_rule(grads, q, k, v, do, causal, dtype):
    """The harness rule for (dq, dk, dv) against the reference backward (fp32 vs `dtype`)."""
    def ref_grads(a, b, c, d):
        return ref.reference_backward(a, b, c, ref.reference_forward(a, b, c, causal=causal), d,
                                      causal=causal)

    hi = ref_grads(*(x.float() for x in (q, k, v, do)))
    lo = ref_grads(q, k, v, do)
    _, reason = compare(grads, hi, lo, dtype, 2.0)
    assert reason is None, reason


def _within_rule(out, inputs_lo, fn_lo):
    """The harness rule: error of `out` vs fp32 <= 2x torch's own fp16 error + 1 ulp."""
    hi = fn_lo(*(x.float() for x in inputs_lo))
    lo = fn_lo(*inputs_lo)
    figures, reason = compare(out, hi, lo, inputs_lo[0].dtype, 2.0)
    assert reason is None, reason
    return figures


# -- formulas -------------------------------------------------------------------------------------

def test_flops_and_bytes():
    p = _params(B=2, H=3, N=128, D=64)
    fwd = 4.0 * 2 * 3 * 128 * 128 * 64
    assert OP.flop_count(p) == fwd
    assert OP.flop_count(_params(B=2, H=3, N=128, D=64, causal=True)) == fwd / 2
    assert OP.flop_count(_params(B=2, H=3, N=128, D=64, mode="bwd")) == 2.5 * fwd
    assert OP.flop_count(_params(B=2, H=3, N=128, D=64, mode="fwd_bwd", causal=True)) \
        == 3.5 * fwd / 2
    e, rows = 2 * 3 * 128 * 64, 2 * 3 * 128
    assert OP.byte_count(p, 2) == 4 * e * 2
    assert OP.byte_count(_params(B=2, H=3, N=128, D=64, mode="bwd"), 2) == 8 * e * 2 + 4 * rows
    assert OP.byte_count(_params(B=2, H=3, N=128, D=64, mode="fwd_bwd"), 4) \
        == 12 * e * 4 + 8 * rows


# -- references -------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_chunked_reference_matches_naive_autograd(causal):
    q, k, v, do = _qkv(2, 3, 37, 16, torch.float64, n=4)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o_naive = ref.naive_attention(*leaves, causal=causal)
    grads = torch.autograd.grad(o_naive, leaves, do)
    o = ref.reference_forward(q, k, v, causal=causal, block_q=8)   # 5 query blocks, ragged
    torch.testing.assert_close(o, o_naive.detach(), rtol=1e-12, atol=1e-12)
    mine = ref.reference_backward(q, k, v, o, do, causal=causal, block_q=8)
    for a, b in zip(mine, grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_reference_block_size_fits_the_largest_case():
    # B=1, H=16, N=16384: the per-block temporary stays at 2^27 elements (512 MiB in fp32)
    bq = ref._block_q(1, 16, 16384, None)
    assert bq * 16 * 16384 <= 1 << 27 and bq >= 16


# -- Triton kernels -------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("N,D", [(100, 16), (64, 64), (1, 32)])
def test_flash_forward_and_lse(causal, N, D):
    q, k, v = _qkv(1, 2, N, D, torch.float16, seed=N)
    o, lse = flash_fwd.flash_forward(q, k, v, causal)
    _within_rule(o, (q, k, v), lambda a, b, c: ref.reference_forward(a, b, c, causal=causal))
    s = q.float() @ k.float().transpose(-1, -2) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(s, -1) * LOG2E, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config", [(32, 16, 4, 1), (32, 32, 4, 1), (64, 16, 4, 1)])
def test_flash_forward_other_tiles_causal_ragged(config):
    q, k, v = _qkv(1, 1, 77, 16, torch.float16, seed=3)
    o, _ = flash_fwd.flash_forward(q, k, v, True, config=config)
    _within_rule(o, (q, k, v), lambda a, b, c: ref.reference_forward(a, b, c, causal=True))


def test_flash_forward_rejects_bad_tiles_and_shapes():
    q, k, v = _qkv(1, 1, 32, 16, torch.float16)
    with pytest.raises(ValueError, match="multiple of BLOCK_N"):
        flash_fwd.flash_forward(q, k, v, True, config=(16, 32, 4, 1))
    q48 = torch.zeros(1, 1, 32, 48, dtype=torch.float16)
    with pytest.raises(ValueError, match="power of two in"):
        flash_fwd.flash_forward(q48, q48, q48, False)


@pytest.mark.parametrize("causal,N,dtype", [(False, 100, torch.float16), (True, 100, torch.float16),
                                            (True, 64, torch.bfloat16)])
def test_flash_backward_matches_reference(causal, N, dtype):
    q, k, v, do = _qkv(1, 2, N, 32, dtype, seed=5, n=4)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = flash_attention(*leaves, causal=causal)
    grads = torch.autograd.grad(o, leaves, do)
    _backward_within_rule(grads, q, k, v, do, causal, dtype)


def test_flash_backward_other_tiles():
    q, k, v, do = _qkv(1, 1, 90, 16, torch.float16, seed=9, n=4)
    o, lse = flash_fwd.flash_forward(q, k, v, True)
    got = flash_bwd.flash_backward(q, k, v, o, lse, do, True, dkdv_config=(16, 16, 4, 1),
                                   dq_config=(64, 32, 4, 1))
    exp = ref.reference_backward(*(x.float() for x in (q, k, v, o, do)), causal=True)
    for a, b in zip(got, exp):
        torch.testing.assert_close(a.float(), b, rtol=0, atol=2e-2)


@pytest.mark.parametrize("causal", [False, True])
def test_fused_mha_forward(causal):
    q, k, v = _qkv(1, 2, 100, 16, torch.float16, seed=11)
    o = fused_mha(q, k, v, causal=causal)
    _within_rule(o, (q, k, v), lambda a, b, c: ref.reference_forward(a, b, c, causal=causal))


# -- through the harness: binder, correctness rule, availability -----------------------------------

@pytest.mark.parametrize("impl,mode,causal,dtype", [
    ("triton_flash", "fwd", True, "bfloat16"),
    ("triton_flash", "bwd", False, "float16"),
    ("triton_flash", "fwd_bwd", True, "float16"),
    ("fused_mha", "fwd", True, "float16"),
    ("naive", "bwd", True, "bfloat16"),
])
def test_harness_check_passes(impl, mode, causal, dtype):
    p = _params(N=70, causal=causal, mode=mode)
    res = check(OP, OP.get_impl(impl), p, dtype, "cpu", trials=1)
    assert res.correct, res.error


def test_torch_compile_backward_passes_check():
    p = _params(N=48, causal=True, mode="bwd")
    res = check(OP, OP.get_impl("torch_compile"), p, "float16", "cpu", trials=1)
    assert res.correct, res.error


def _fake(name, fn):
    return Impl(name=name, op="attention", fn=fn, backend="torch")


@pytest.mark.parametrize("mode", ["fwd", "bwd"])
def test_wrong_impls_fail(mode):
    p = _params(N=70, causal=True, mode=mode)
    zeros = _fake("zeros", lambda q, k, v, causal=False: (q + k + v) * 0)
    res = check(OP, zeros, p, "float16", "cpu", trials=1)
    assert not res.correct and "tolerance" in res.error
    no_mask = _fake("no_mask", lambda q, k, v, causal=False: flash_attention(q, k, v,
                                                                             causal=False))
    res = check(OP, no_mask, p, "float16", "cpu", trials=1)
    assert not res.correct and "tolerance" in res.error


def test_wrong_backward_fails():
    """A correct forward with a wrong gradient (dq scaled by 2) is caught in bwd mode."""

    class HalfWrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal):
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                o = ref.naive_attention(*leaves, causal=causal)
            ctx.graph = (leaves, o)
            return o.detach()

        @staticmethod
        def backward(ctx, do):
            leaves, o = ctx.graph
            dq, dk, dv = torch.autograd.grad(o, leaves, do, retain_graph=True)
            return 2 * dq, dk, dv, None

    bad = _fake("bad_dq", lambda q, k, v, causal=False: HalfWrong.apply(q, k, v, causal))
    assert check(OP, bad, _params(N=40, mode="fwd"), "float16", "cpu", trials=1).correct
    res = check(OP, bad, _params(N=40, mode="bwd"), "float16", "cpu", trials=1)
    assert not res.correct and "output 0" in res.error


def test_binder_runs_forward_once_outside_the_measured_call():
    calls = []

    def counting(q, k, v, causal=False):
        calls.append(1)
        return ref.naive_attention(q, k, v, causal=causal)

    p = _params(N=20, mode="bwd")
    inputs = OP.make_inputs(p, torch.float16, "cpu", torch.Generator().manual_seed(0))
    assert len(inputs) == 4
    fn = OP.bind(counting, inputs, p)
    assert len(calls) == 1
    a, b = fn(), fn()                                   # retain_graph: repeatable
    assert len(calls) == 1 and len(a) == 3
    torch.testing.assert_close(a[0], b[0])
    both = OP.bind(counting, inputs, _params(N=20, mode="fwd_bwd"))()
    assert len(calls) == 2 and len(both) == 4
    # the reference takes the explicit chunked backward, same outputs
    ref_out = OP.run_reference(inputs, p)
    for x, y in zip(ref_out, a):
        torch.testing.assert_close(x, y, rtol=0, atol=5e-3)


def test_availability_reasons():
    bwd = _params(mode="bwd")
    assert "forward only" in OP.get_impl("fused_mha").reason_unavailable(bwd, "float16", "cpu")
    assert OP.get_impl("triton_flash").reason_unavailable(bwd, "float16", "cpu") is None
    assert "power of two" in OP.get_impl("triton_flash").reason_unavailable(
        _params(D=48), "float16", "cpu")
    for name in ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn"):
        assert "CUDA" in OP.get_impl(name).reason_unavailable(_params(), "float16", "cpu")
    for name in ("naive", "torch_compile"):
        assert OP.get_impl(name).reason_unavailable(bwd, "bfloat16", "cpu") is None


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_wrapper_runs_the_named_backend(causal):
    """On CPU torch has a FLASH_ATTENTION kernel too: the wrapper's plumbing (backend choice,
    is_causal) is checked there; the CUDA kernels are what the experiments measure."""
    q, k, v = _qkv(1, 2, 50, 16, torch.float32)
    o = peers.sdpa("flash")(q, k, v, causal=causal)
    torch.testing.assert_close(o, ref.reference_forward(q, k, v, causal=causal), rtol=1e-4,
                               atol=1e-5)
    with pytest.raises(RuntimeError):           # no CPU kernel for this backend: torch refuses
        peers.sdpa("efficient")(q, k, v, causal=causal)


# -- experiments -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name,mode,impls", [
    ("flash.yaml", "fwd", 7), ("flash_bwd.yaml", "bwd", 6)])
def test_experiment_files(name, mode, impls):
    exp = spec.load(ROOT / "experiments" / name)
    cases = spec.expand(exp)
    assert len(cases) == 5 * 2 * 2 * 2 * impls
    for c in cases:
        d = c.params_dict
        assert d["B"] * d["N"] == 16384 and d["H"] == 16 and d["mode"] == mode
    # each ncu glob names exactly one case per implementation
    for glob in exp.profile.ncu.cases:
        chosen = spec.select(cases, glob)
        assert sorted(c.impl for c in chosen) == sorted(exp.impl_names())
    smoke = spec.expand(exp, smoke=True)
    assert {c.params_dict["N"] for c in smoke} == {100, 64}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_aot_build_for_sm90_without_spills(dtype):
    """The kernels compile for Hopper (not only in the interpreter) and do not spill (past
    aot_check's SPILL_BUDGET, per configuration), in both 16-bit dtypes (the Gluon kernels'
    layouts and TMA descriptors are dtype-specific)."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    assert tool.exists(), "the triton wheel ships ptxas on x86-64 Linux"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "kernels.attention.aot_check", "--quick",
                           "--d", "128", "--dtype", dtype], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "0 configuration(s) spill" in proc.stdout
    # the TMA kernels really use TMA (cp.async.bulk.tensor), the pointer kernels never
    kernels = set()
    for line in proc.stdout.splitlines():
        if "regs" in line:
            kernels.add(line.split()[0])
            assert ("tma 0" not in line) == ("_tma" in line.split()[0]), line
    assert "gluon_tma" in kernels  # the Gluon forward builds (its warp-specialized partitions)
    assert "gluon_bwd_tma" in kernels  # and the one-pass Gluon backward


@pytest.mark.slow
def test_cli_smoke_run_flash(cpu_flash_run):
    """`python -m harness run experiments/flash.yaml` on the CPU (the README's main command,
    run once per session by the cpu_flash_run fixture): the smoke sweep, every non-skipped
    case correct and timed; the CUDA-only peers skipped with a reason."""
    run_dir, _ = cpu_flash_run
    merged = store.load_cases(run_dir).merge(store.load_results(run_dir), on="case_id",
                                             how="left")
    ran = merged[merged.status != "skipped"]
    assert set(ran.impl) == {"naive", "fused_mha", "triton_flash", "torch_compile"}
    assert (ran.status == "ok").all(), ran[["case_id", "status", "error"]].to_string()
    assert ran.correct.astype(bool).all()
    assert ran.median_ms.notna().all()
    skipped = merged[merged.status == "skipped"]
    assert set(skipped.impl) == {"sdpa_flash", "sdpa_efficient", "sdpa_cudnn"}
    assert skipped.error.str.contains("CUDA").all()
    assert {json.loads(p)["N"] for p in merged.params} == {100, 64}


def test_torch_compile_graphs_first_run_at_the_seed_shape(monkeypatch):
    """Each torch.compile graph's first call is at SEED_SHAPE whatever the first case is, so
    the kernels Inductor chooses (from that call's sizes) do not depend on which cases ran
    before; once per (D, causal, dtype, device, grad); the backward graph is seeded too."""
    from kernels.attention import peers

    calls = []

    def fake(q, k, v, causal):
        calls.append((tuple(q.shape), causal, q.requires_grad))
        return (q * k * v).sum(-1, keepdim=True).expand_as(q) * 1.0

    monkeypatch.setattr(peers, "_compiled_naive", fake)
    monkeypatch.setattr(peers, "_seeded", set())
    bh, n = peers.SEED_SHAPE["cpu"]
    for N in (48, 32):
        q = torch.randn(1, 2, N, 16)
        peers.torch_compile_attention(q, q, q, causal=False)
    q = torch.randn(2, 2, 40, 16, requires_grad=True)
    o = peers.torch_compile_attention(q, q, q, causal=True)
    assert calls == [((bh, n, 16), False, False), ((2, 48, 16), False, False),
                     ((2, 32, 16), False, False), ((bh, n, 16), True, True),
                     ((4, 40, 16), True, True)]
    assert o.shape == (2, 2, 40, 16)


def test_a_compile_only_call_is_not_the_seed(monkeypatch):
    """A compile-only call (compile-ahead, a prewarm) chooses none of Inductor's configs
    (harness.tuning.inductor_picks), so it does not count as the graph's seed call: the
    process's first measured call makes it, at SEED_SHAPE, and chooses there."""
    from harness import tuning
    from kernels.attention import peers

    seeds = []
    monkeypatch.setattr(peers, "_compiled_naive",
                        lambda q, k, v, causal: seeds.append(tuple(q.shape)) or q.clone())
    monkeypatch.setattr(peers, "_seeded", set())
    monkeypatch.setattr(peers, "_seeded_untimed", set())
    bh, n = peers.SEED_SHAPE["cpu"]
    q = torch.randn(1, 2, 32, 16)
    with tuning.compile_only():  # compiles the graph at the seed shape, once
        peers._seed(q, False)
        peers._seed(q, False)
    assert seeds == [(bh, n, 16)] and not peers._seeded
    peers._seed(q, False)  # the first measured call seeds again, then never
    peers._seed(q, False)
    with tuning.compile_only():
        peers._seed(q, False)
    assert seeds == [(bh, n, 16)] * 2
    assert peers._seeded == {(16, False, torch.float32, "cpu", False)}


def test_torch_compile_views_keep_the_head_dim_static():
    """B*H and N dynamic from the first call, D static: a process's graphs (and Inductor's
    cache keys) do not depend on which head dim it met first."""
    from kernels.attention import peers

    q = torch.randn(1, 2, 8, 16)
    for t in peers._dynamic_views(q, q, q):
        assert t.shape == (2, 8, 16)
        assert getattr(t, "_dynamo_weak_dynamic_indices", set()) >= {0, 1}
        assert 2 in getattr(t, "_dynamo_static_indices", set())
