"""triton_flash_tma: the FlashAttention forward with TMA descriptors (CPU interpreter) against
the references: output and LSE, causal and not, fp16/bf16, several query/key tiles per head and
several heads (a box must never cross into the next head), the GPU's configs, the backward
through autograd, the N rule, and broken variants that must fail."""
from __future__ import annotations

import math

import pytest
import torch

from harness.execute.correctness import check
from harness.registry import Impl
from kernels.attention import flash_fwd_tma as fft
from kernels.attention import reference as ref
from test_attention import LOG2E, OP, _qkv, _within_rule
from test_attention import _params as attention_params


def _params(**kw):
    return attention_params(**{"N": 64, **kw})


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,H,N,D", [(2, 2, 96, 16), (1, 3, 64, 32)])
def test_forward_and_lse(B, H, N, D, causal, dtype):
    q, k, v = _qkv(B, H, N, D, dtype, seed=N + D)
    o, lse = fft.flash_forward_tma(q, k, v, causal)
    _within_rule(o, (q, k, v), lambda a, b, c: ref.reference_forward(a, b, c, causal=causal))
    s = q.float() @ k.float().transpose(-1, -2) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(s, -1) * LOG2E, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("config", fft.TMA_CONFIGS[64][:3], ids=str)
def test_gpu_configs(config):
    """The Hopper candidates (128-row query tiles, 64/128-row key tiles), causal, 2 heads."""
    q, k, v = _qkv(1, 2, 256, 64, torch.float16, seed=1)
    o, _ = fft.flash_forward_tma(q, k, v, True, config=config)
    _within_rule(o, (q, k, v), lambda a, b, c: ref.reference_forward(a, b, c, causal=True))


@pytest.mark.parametrize("causal", [False, True])
def test_registered_impl_forward_and_backward(causal):
    for mode in ("fwd", "bwd"):
        res = check(OP, OP.get_impl("triton_flash_tma"), _params(causal=causal, mode=mode),
                    "float16", "cpu")
        assert res.correct, (mode, res.error)


def test_n_rule():
    impl = OP.get_impl("triton_flash_tma")
    why = impl.reason_unavailable(_params(N=100), "float16", "cpu")
    assert "N must be a multiple of 32, got N=100" in why
    assert impl.reason_unavailable(_params(N=96), "float16", "cpu") is None
    q = torch.zeros(1, 1, 40, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="multiple of 32"):
        fft.flash_forward_tma(q, q, q, False)
    q = torch.zeros(1, 1, 64, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="BLOCK_M must divide"):
        fft.flash_forward_tma(q, q, q, False, config=(16, 32, 4, 1))


def test_wrong_sequence_length_fails():
    """The kernel launched as if N were one query tile (head offsets and key range wrong,
    most O rows never written) must fail the check."""
    def broken(q, k, v, causal=False):
        B, H, N, D = q.shape
        bm, bn, _, _ = fft.INTERPRETER_CONFIG
        o = torch.empty_like(q)
        lse = torch.empty((B, H, N), dtype=torch.float32)
        rows = [t.contiguous().view(B * H * N, D) for t in (q, k, v, o)]
        descs = [fft.TensorDescriptor.from_tensor(t, [b, D])
                 for t, b in zip(rows, (bm, bn, bn, bm))]
        fft._flash_fwd_tma_kernel[(N // bm, B * H)](
            *descs, lse, bm, LOG2E / math.sqrt(D), HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn,
            CAUSAL=False, INTERP_BF16=False)
        return o

    impl = Impl(name="wrong_n", op=OP.name, fn=broken, backend="triton")
    res = check(OP, impl, _params(causal=True), "float16", "cpu", trials=1)
    assert not res.correct


@pytest.mark.parametrize("causal", [False, True])
def test_backward_gradients_gpu_tiles(causal):
    """The TMA backward with Hopper tiles (dK/dV 64-row query tiles on 128-key programs, dQ
    128-row programs on 64-key tiles) over 2 heads of N=256, against autograd of the
    reference in fp32."""
    from kernels.attention import flash_bwd_tma as fbt

    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 256, 32, torch.float16, seed=7))
    do = _qkv(1, 2, 256, 32, torch.float16, seed=8)[0]
    o, lse = fft.flash_forward_tma(q.detach(), k.detach(), v.detach(), causal)
    got = fbt.flash_backward_tma(q.detach(), k.detach(), v.detach(), o, lse, do, causal,
                                 dkdv_config=(64, 128, 8, 3), dq_config=(128, 64, 8, 3))
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    s = qf @ kf.transpose(-1, -2) / math.sqrt(32)
    if causal:
        s = s.masked_fill(torch.ones(256, 256, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.autograd.grad(torch.softmax(s, -1) @ vf, (qf, kf, vf), do.float())
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w, rtol=2e-2, atol=2e-2)


def test_backward_tile_rule():
    from kernels.attention import flash_bwd_tma as fbt

    q = torch.zeros(1, 1, 64, 16, dtype=torch.float16)
    lse = torch.zeros(1, 1, 64)
    with pytest.raises(ValueError, match="BLOCK_N1 must divide"):
        fbt.flash_backward_tma(q, q, q, q, lse, q, False, dkdv_config=(32, 128, 4, 1),
                               dq_config=(32, 16, 4, 1))
    assert "no backward tile divides N=48" in fbt.unsupported(48, 16)


# -- triton_flash: the pointer and TMA forms behind one Tuner field (TMA: 0 / 1) -----------------

class _Candidates:
    """Records the candidates a Tuner is offered and, per call, those its `timed` predicate
    would time on a GPU (all when it has none); picks as the interpreter does."""

    def __init__(self, tuner):
        self.tuner, self.seen, self.timed = tuner, [], []

    def __enter__(self):
        orig = self.tuner.pick
        self._orig = orig

        def pick(key, candidates, launch, timed=None):
            self.seen.append(list(candidates))
            self.timed.append([c for c in candidates if timed is None or timed(c)]
                              or list(candidates))  # the Tuner's rule: none accepted -> all
            return orig(key, candidates, launch, timed=timed)

        self.tuner.pick = pick
        return self

    def __exit__(self, *exc):
        self.tuner.pick = self._orig


def test_default_impl_offers_both_forms_where_n_allows():
    """triton_flash's Tuners get the pointer configs (TMA=0) first and, where N is a multiple
    of the TMA tiles, the TMA configs (TMA=1), which are then the ones timed; for ragged N only
    the pointer ones."""
    from kernels.attention import flash_bwd, flash_fwd
    from kernels.attention.flash import flash_attention

    for N, want_tma in ((64, True), (100, False)):
        q, k, v = (t.requires_grad_() for t in _qkv(1, 1, N, 16, torch.float16, seed=N))
        with _Candidates(flash_fwd._tuner) as fwd, _Candidates(flash_bwd._dkdv_tuner) as dkdv, \
                _Candidates(flash_bwd._dq_tuner) as dq:
            o = flash_attention(q, k, v, causal=True)
            torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
        for rec in (fwd, dkdv, dq):
            forms = [c[-1] for c in rec.seen[0]]
            assert forms[0] == 0 and (1 in forms) == want_tma, (N, forms)
            timed = {c[-1] for c in rec.timed[0]}
            assert timed == ({1} if want_tma else {0}), (N, timed)
    assert flash_fwd._tuner.fields[-1] == "TMA" and flash_bwd._dkdv_tuner.fields[-1] == "TMA"


@pytest.mark.parametrize("causal", [False, True])
def test_default_impl_forced_tma_form(causal):
    """TMA: 1 forced on triton_flash (as a YAML variant does) runs the TMA kernels for the
    forward and both backward kernels, and the results pass the check."""
    from harness import tuning
    from kernels.attention import flash_bwd_tma

    launched = []
    orig = flash_bwd_tma.tma_launchers

    def spy(*a, **kw):
        launched.append("bwd")
        return orig(*a, **kw)

    force = {"attention.flash_fwd": {"TMA": 1}, "attention.flash_bwd.dkdv": {"TMA": 1},
             "attention.flash_bwd.dq": {"TMA": 1}}
    flash_bwd_tma.tma_launchers = spy
    try:
        with tuning.forcing(force), tuning.recording() as log:
            for mode in ("fwd", "bwd"):
                res = check(OP, OP.get_impl("triton_flash"), _params(causal=causal, mode=mode),
                            "float16", "cpu")
                assert res.correct, (mode, res.error)
    finally:
        flash_bwd_tma.tma_launchers = orig
    assert launched and all(c["TMA"] == 1 for c in log.configs().values()), log.configs()


def test_default_impl_tma_on_ragged_n_is_a_clear_error():
    from kernels.attention import flash_fwd

    q = torch.zeros(1, 1, 40, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"TMA=1, but .*multiple of 32, got N=40"):
        flash_fwd.flash_forward(q, q, q, False, config=(32, 16, 4, 1, 1))


def _forced_tma_form(tma: int, causal: bool, monkeypatch):
    """triton_flash's forward checked with `TMA: tma` forced: (the check's result, the keyword
    arguments of every TMA launch, the TMA values the Tuner recorded)."""
    from harness import tuning
    from kernels.attention import flash_fwd_tma

    calls = []
    orig = flash_fwd_tma.tma_launcher

    def spy(*a, **kw):
        launch = orig(*a, **kw)

        def wrapped(cfg, ws=False, maxnreg=None):
            calls.append({"ws": ws, "maxnreg": maxnreg})
            return launch(cfg, ws=ws, maxnreg=maxnreg)

        return wrapped

    monkeypatch.setattr(flash_fwd_tma, "tma_launcher", spy)
    with tuning.forcing({"attention.flash_fwd": {"TMA": tma}}), tuning.recording() as log:
        res = check(OP, OP.get_impl("triton_flash"), _params(causal=causal, mode="fwd"),
                    "float16", "cpu")
    return res, calls, {c["TMA"] for c in log.configs().values()}


@pytest.mark.parametrize("causal", [False, True])
def test_warp_specialized_tma_form_when_forced(causal, monkeypatch):
    """TMA: 2 (the TMA kernel with warp-specialized key loops) runs only when forced, reaches
    the kernel's WS flag, and passes the check; the Tuner never times it by default."""
    from kernels.attention import flash_fwd

    res, calls, tmas = _forced_tma_form(2, causal, monkeypatch)
    flags = [c["ws"] for c in calls]
    assert res.correct, res.error
    assert flags and all(flags) and tmas == {2}
    assert not flash_fwd.uses_tma((64, 64, 4, 3, 2))  # not in what is timed by default
    with pytest.raises(ValueError, match=r"TMA=2, but .*got N=40"):
        q = torch.zeros(1, 1, 40, 16, dtype=torch.float16)
        flash_fwd.flash_forward(q, q, q, False, config=(32, 16, 4, 1, 2))


@pytest.mark.parametrize("causal", [False, True])
def test_register_capped_tma_form_when_forced(causal, monkeypatch):
    """TMA: 3 (the TMA kernel launched with a register cap, `maxnreg`: e.g. two 8-warp
    programs per SM at D=128) asks for the cap (the interpreter ignores it) and passes the
    check; on a GPU its configs join the timed TMA candidates where N allows them."""
    from kernels.attention import flash_fwd, flash_fwd_tma

    res, calls, tmas = _forced_tma_form(3, causal, monkeypatch)
    caps = [c["maxnreg"] for c in calls]
    assert res.correct, res.error
    assert caps and set(caps) == {flash_fwd_tma.REG_CAP_DEFAULT}  # the interpreter's tile
    assert tmas == {3}
    assert flash_fwd.uses_tma((128, 64, 8, 2, 3)) and not flash_fwd.uses_tma((128, 64, 8, 2, 2))
    assert flash_fwd_tma.capped_configs_for(128, 4096) == []  # the interpreter: nothing to cap


def test_register_capped_candidates_on_a_gpu(monkeypatch):
    from kernels.attention import flash_fwd_tma

    monkeypatch.setattr(flash_fwd_tma, "interpreted", lambda: False)
    assert flash_fwd_tma.capped_configs_for(128, 4096) == [(128, 64, 8, 2)]
    assert flash_fwd_tma.capped_configs_for(128, 4160) == []  # 128 does not divide N
    assert flash_fwd_tma.capped_configs_for(64, 4096) == [(128, 128, 8, 2)]
    assert flash_fwd_tma.reg_cap(128, (128, 64, 8, 2, 3)) == 128
    assert flash_fwd_tma.reg_cap(64, (64, 64, 4, 2)) == 96  # forceable, not timed
    assert flash_fwd_tma.reg_cap(64, (64, 32, 4, 2)) == flash_fwd_tma.REG_CAP_DEFAULT
