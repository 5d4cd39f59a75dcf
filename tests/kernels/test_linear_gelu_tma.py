"""linear_gelu triton_tma: the persistent TMA matmul (interpreter) against the reference under
the harness's tolerance rule; ragged edges and K tail (zero-filled by the descriptor), several
tiles per program, every Hopper config, the 16-byte stride rule, broken variants."""
import pytest
import torch

from harness.execute.correctness import check
from harness.registry import Impl, Params, get_op
from kernels.linear_gelu import triton_matmul_tma as tmt

OP = get_op("linear_gelu")


def _p(M, K, N, approximate="none"):
    return Params(M=M, K=K, N=N, approximate=approximate)


def _impl(fn, name="probe"):
    return Impl(name=name, op=OP.name, fn=fn, backend="triton", accepts_out=True)


def _forced(cfg, act="gelu", name="probe"):
    return _impl(lambda x, w, b, approximate="none", out=None:
                 tmt.matmul_bias_act_tma(x, w, b, act=act, out=out, config=cfg), name)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("M,K,N", [(1, 16, 16), (37, 72, 88), (130, 128, 296)])
def test_triton_tma(M, K, N, dtype, approximate):
    """Through the registered impl: the interpreter config (32x32x32 tiles on 3 programs), so
    (130, 128, 296) is 50 tiles, ~17 per program, with a ragged last group and edge tiles."""
    res = check(OP, OP.get_impl("triton_tma"), _p(M, K, N, approximate), dtype, "cpu", trials=1)
    assert res.correct, res.error


@pytest.mark.parametrize("config", tmt.CONFIGS, ids=lambda c: c.label().replace(" ", "_"))
def test_every_hopper_config_ragged(config):
    """The GPU's candidates on M, N past a tile edge and K not a multiple of BLOCK_K."""
    res = check(OP, _forced(config), _p(130, 72, 264), "float16", "cpu", trials=1)
    assert res.correct, res.error


def test_more_tiles_than_programs_split_epilogue():
    """12 tiles over 3 programs, GROUP_M=2 with a ragged last group, both epilogue halves."""
    cfg = tmt.TmaConfig(32, 32, 16, 2, 4, 1, 2)
    res = check(OP, _forced(cfg, "gelu_tanh"), _p(100, 40, 72, "tanh"), "bfloat16", "cpu",
                trials=1)
    assert res.correct, res.error


def test_tile_order_visits_every_tile_once():
    """The persistent walk (tile_id = pid, pid + NUM_SMS, ...) in grouped order covers every
    (pid_m, pid_n) exactly once: checked with an identity-free matmul whose each output tile
    is distinct (a tile written twice or never would show as wrong or poisoned values)."""
    cfg = tmt.TmaConfig(16, 16, 16, 3, 4, 1, 1)
    a = torch.arange(80 * 16, dtype=torch.float32).reshape(80, 16) / 1000
    w = torch.eye(16).repeat(3, 1)  # N = 48: C = A repeated three times along columns
    c = torch.full((80, 48), float("nan"))
    tmt.matmul_bias_act_tma(a, w, out=c, config=cfg)
    torch.testing.assert_close(c, a.repeat(1, 3))


def test_stride_rule():
    impl = OP.get_impl("triton_tma")
    why = impl.reason_unavailable(_p(37, 50, 70), "float16", "cuda")
    assert "K=50, N=70" in why and "multiples of 8 in float16" in why
    assert impl.reason_unavailable(_p(37, 56, 72), "bfloat16", "cuda") is None
    with pytest.raises(ValueError, match="16 bytes"):
        tmt.matmul_bias_act_tma(torch.zeros(4, 12, dtype=torch.float16),
                                torch.zeros(8, 12, dtype=torch.float16))
    with pytest.raises(ValueError, match="act must be"):
        tmt.matmul_bias_act_tma(torch.zeros(2, 8), torch.zeros(2, 8), act="relu")


def test_bias_dropped_fails():
    impl = _impl(lambda x, w, b, approximate="none", out=None:
                 tmt.matmul_bias_act_tma(x, w, None, act="gelu", out=out), "no_bias")
    res = check(OP, impl, _p(33, 40, 48), "float16", "cpu", trials=1)
    assert not res.correct


def test_one_program_short_fails():
    """A persistent grid one program short of what the kernel strides by leaves tiles
    unwritten: the poisoned output must catch it."""
    def broken(x, w, b, approximate="none", out=None):
        cfg = tmt.INTERPRETER_CONFIG
        c = out if out is not None else torch.empty(x.shape[0], w.shape[0], dtype=x.dtype)
        tmt._matmul_tma[(tmt.INTERPRETER_SMS - 1,)](
            tmt.TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k]),
            tmt.TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k]),
            tmt.TensorDescriptor.from_tensor(c, [cfg.block_m, cfg.block_n // cfg.epi_split]),
            b, x.shape[0], w.shape[0], x.shape[1], HAS_BIAS=True, ACT=1, DOT_F32=False,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m, EPI_SPLIT=cfg.epi_split, NUM_SMS=tmt.INTERPRETER_SMS,
            C_DTYPE=tmt.TL_DTYPES[c.dtype])
        return c

    res = check(OP, _impl(broken, "short_grid"), _p(100, 32, 96), "float16", "cpu", trials=1)
    assert not res.correct


# -- triton (the default impl): the pointer and TMA forms behind one Tuner field (TMA: 0 / 1) ----

def test_default_impl_offers_both_forms_where_tma_allows():
    """matmul_bias_act's Tuner gets the pointer configs (TMA=0) first and, where K and N allow
    TMA and the operands are contiguous, the TMA kernel's (TMA=1), the ones it then times;
    otherwise only the pointer ones."""
    from kernels.linear_gelu import triton_matmul as tm
    from test_attention_tma import _Candidates

    x, w = torch.randn(24, 40, dtype=torch.float16), torch.randn(48, 40, dtype=torch.float16)
    odd_x, odd_w = x[:, :36].contiguous(), w[:, :36].contiguous()  # K=36: 72-byte rows
    with _Candidates(tm._tuner) as rec:
        tm.matmul_bias_act(x, w)
        tm.matmul_bias_act(odd_x, odd_w)
        tm.matmul_bias_act(x[:, :32], w[:, :32])  # K=32 but rows 80 bytes apart: not contiguous
    forms = [[c.tma for c in cands] for cands in rec.seen]
    assert [f[0] for f in forms] == [0, 0, 0]
    assert [1 in f for f in forms] == [True, False, False], forms
    # timed on a GPU: the TMA configs where they are offered, else the pointer ones
    assert [{c.tma for c in cands} for cands in rec.timed] == [{1}, {0}, {0}]
    assert tm._tuner.fields[-2:] == ("EPI_SPLIT", "TMA")
    assert tmt.tma_refusal(odd_x, odd_w, torch.empty(24, 48, dtype=torch.float16)).startswith(
        "TMA needs row strides")


@pytest.mark.parametrize("op_name,params", [("linear_gelu", _p(37, 56, 72)),
                                            ("mlp", Params(M=37, D=32, H=80,
                                                           approximate="none"))])
def test_default_impl_forced_tma_form(op_name, params):
    """TMA: 1 forced on `triton` (as a YAML variant does) runs the TMA kernel for every matmul
    of the case (the MLP's two), and the results pass the check."""
    from harness import tuning
    from kernels.linear_gelu import triton_matmul_tma

    op = get_op(op_name)
    launched = []
    orig = triton_matmul_tma.launch

    def spy(*a, **kw):
        launched.append(a[5])
        return orig(*a, **kw)

    triton_matmul_tma.launch = spy
    try:
        with tuning.forcing({"matmul_bias_act": {"TMA": 1}}), tuning.recording() as log:
            res = check(op, op.get_impl("triton"), params, "float16", "cpu")
    finally:
        triton_matmul_tma.launch = orig
    assert res.correct, res.error
    picks = log.configs()
    assert launched and all(c["TMA"] == 1 for c in picks.values()), picks
    assert len(picks) == (2 if op_name == "mlp" else 1)


def test_default_impl_forced_tma_where_k_forbids_is_a_clear_error():
    from kernels.linear_gelu import triton_matmul as tm

    x, w = torch.zeros(4, 12, dtype=torch.float16), torch.zeros(8, 12, dtype=torch.float16)
    cfg = tm.MatmulConfig(32, 32, 32, 2, 4, 1, epi_split=2, tma=1)
    with pytest.raises(ValueError, match=r"TMA=1, but TMA needs row strides .*K=12"):
        tm.matmul_bias_act(x, w, config=cfg)
    # the pointer form takes the same operands
    torch.testing.assert_close(tm.matmul_bias_act(x, w), torch.zeros(4, 8, dtype=torch.float16))
