"""The one-pass Gluon backward (kernels/attention/flash_bwd_gluon.py) off the GPU: Gluon kernels
do not run in the CPU interpreter, so CI checks the plumbing around it with a stand-in launch
(the dK/dV Tuner's TMA: 4 candidates, timed as whole backwards; the size of its dQ ring and
the ring's zeroing in the delta kernel; the launcher's buffers and last heads' copy, with the
kernel replaced; the reasons it is unavailable; the config rules) and, in
test_attention.py's sm_90 build, that its first config compiles within its spill budget (one
is kept for the causal build: kernels/attention/aot_check.py). Its numerics are
checked on the GPU by the harness's check pass (every triton_flash case of
experiments/flash_bwd.yaml)."""
from __future__ import annotations

import math

import pytest
import torch

import kernels._common
import kernels._gluon

from harness import tuning
from harness.execute.correctness import check
from kernels.attention import flash_bwd, flash_bwd_gluon, flash_bwd_tma, flash_fwd
from test_attention import OP, _backward_within_rule, _qkv
from test_attention import _params as attention_params

GLUON = [(*c, 4) for c in flash_bwd_gluon.GLUON_CONFIGS[128]]


def test_unavailable_on_the_cpu_with_a_reason():
    assert "GPU only" in flash_bwd_gluon.unsupported(4096, 128, torch.device("cpu"))
    q, k, v, do = _qkv(1, 1, 128, 128, torch.float16, n=4)
    o, lse = flash_fwd.flash_forward(q, k, v, False)
    with pytest.raises(ValueError, match=r"TMA=4, but Gluon kernels run on a GPU only"):
        flash_bwd.flash_backward(q, k, v, o, lse, do, False, dkdv_config=GLUON[0])


def test_forced_on_the_cpu_is_the_case_error():
    """A YAML variant forcing the one-pass form off Hopper: the case's check raises the reason
    (the worker fails that case with it, the run goes on)."""
    with tuning.forcing({"attention.flash_bwd.dkdv": {"TMA": 4}}), \
            pytest.raises(ValueError, match="TMA=4, but Gluon kernels run on a GPU only"):
        check(OP, OP.get_impl("triton_flash"), attention_params(N=128, D=128, mode="bwd"),
              "float16", "cpu")


def test_shape_and_config_rules(monkeypatch):
    """On a (faked) GPU: Hopper only, D 64 or 128, N a multiple of 128; configs within the kernel's
    fixed tiles and shared memory."""
    gpu = torch.device("cuda")
    monkeypatch.setattr(kernels._common, "interpreted", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert flash_bwd_gluon.unsupported(4096, 128, gpu) is None
    assert "multiple of 128, got N=4032" in flash_bwd_gluon.unsupported(4032, 128, gpu)
    assert flash_bwd_gluon.unsupported(4096, 64, gpu) is None
    assert "head dim 64 or 128, got D=32" in flash_bwd_gluon.unsupported(4096, 32, gpu)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    assert "wgmma (sm_90); this GPU is sm_100" in flash_bwd_gluon.unsupported(4096, 128, gpu)
    monkeypatch.setattr(kernels._gluon, "triton_version", lambda: (3, 5))
    assert "needs triton >= 3.6" in flash_bwd_gluon.unsupported(4096, 128, gpu)
    assert flash_bwd_gluon.configs_for(128, 4096) == flash_bwd_gluon.GLUON_CONFIGS[128]
    assert flash_bwd_gluon.configs_for(64, 4096) == flash_bwd_gluon.GLUON_CONFIGS[64]
    assert flash_bwd_gluon.configs_for(32, 4096) == []
    for cfg in flash_bwd_gluon.GLUON_CONFIGS[128]:
        flash_bwd_gluon.check_config(cfg, 128)
    for cfg, field in (((128, 128, 4, 2), "tiles are BLOCK_M 64, BLOCK_N 128"),
                       ((64, 64, 4, 2), "tiles are BLOCK_M 64, BLOCK_N 128"),
                       ((64, 128, 8, 2), "num_warps is 4"),
                       ((64, 128, 4, 4), "num_stages .* 1 to 3"),
                       ((64, 128, 4, 0), "num_stages .* 1 to 3")):
        with pytest.raises(ValueError, match=field):
            flash_bwd_gluon.check_config(cfg, 128)
    assert all(flash_fwd.uses_tma(c) for c in GLUON)


def test_the_dq_ring_is_sized_by_heads_in_flight_not_by_heads():
    """The fp32 dQ accumulators are a ring of heads' buffers: as many as the heads whose
    programs run at once (one program per SM, N / 128 per head), with room for causal
    programs' unequal lengths; never more than the heads there are."""
    slots = flash_bwd_gluon.ring_slots
    # 132 SMs (an H100 SXM), N = 4096: 32 programs a head, ~4 heads in flight
    assert slots(4, 16, 4096, False, 132) == 2 + math.ceil(1.25 * 132 / 32) == 8
    assert slots(4, 16, 4096, True, 132) == 2 + math.ceil(2.5 * 132 / 32) == 13
    # the batch and head counts do not size it; small problems keep one slot a head
    assert slots(64, 16, 4096, False, 132) == slots(4, 16, 4096, False, 132)
    assert slots(1, 2, 4096, True, 132) == 2
    assert slots(1, 16, 16384, False, 132) == 4
    # fewer programs a head, more heads in flight
    assert slots(16, 16, 1024, False, 132) > slots(16, 16, 4096, False, 132)
    for B, H, N in ((4, 16, 4096), (1, 16, 16384), (2, 16, 8192), (16, 16, 1024)):
        for causal in (False, True):
            assert 2 <= slots(B, H, N, causal, 132) <= B * H


def test_delta_kernel_zeroes_the_dq_ring_and_counters():
    """The ring and its counters cost no kernel of their own: the delta kernel zeroes the
    first `ring` heads' rows of the ring and every counter, and writes delta as without them."""
    B, H, N, D, ring = 2, 3, 100, 32, 4
    o, do = _qkv(B, H, N, D, torch.float16, seed=2, n=2)
    delta = torch.empty(B, H, N)
    acc = torch.full((ring * N, D), float("nan"))
    sync = torch.full((1 + 2 * B * H,), 7, dtype=torch.int32)
    flash_bwd.preprocess(o, do, delta, acc, sync)
    assert torch.equal(acc, torch.zeros_like(acc))
    assert torch.equal(sync, torch.zeros_like(sync))
    want = (o.float() * do.float()).sum(-1)
    torch.testing.assert_close(delta, want, rtol=1e-5, atol=1e-5)
    delta2 = torch.empty(B, H, N)
    flash_bwd.preprocess(o, do, delta2)  # no buffers: delta only
    torch.testing.assert_close(delta2, want, rtol=1e-5, atol=1e-5)


def _stand_in(launches, tma_launchers=flash_bwd_tma.tma_launchers):
    """A gluon_launcher whose launch writes dQ, dK and dV with the Triton TMA kernels (what
    the Gluon kernel writes, computed by kernels that run in the interpreter)."""
    def launcher(q, k, v, do, lse, delta, dq, dk, dv, causal):
        def launch(cfg, zero_with=None):
            flash_bwd_gluon.check_config(cfg, q.shape[-1])
            launches.append(tuple(cfg))
            if zero_with is not None:  # the delta kernel, which the kernels below read
                B, H, N, D = q.shape
                zero_with(torch.empty(N, D), torch.empty(1 + 2 * B * H, dtype=torch.int32))
            dkdv, dq_kernel = tma_launchers(q, k, v, do, lse, delta, dq, dk, dv, causal)
            dkdv(flash_bwd.INTERPRETER_DKDV)
            dq_kernel(flash_bwd.INTERPRETER_DQ)
        return launch
    return launcher


@pytest.mark.parametrize("causal,dtype", [(False, torch.float16), (True, torch.bfloat16)])
def test_tuner_times_the_one_pass_form_as_whole_backwards(causal, dtype, monkeypatch):
    """Where the one-pass form runs (a Hopper GPU; here faked), the dK/dV Tuner gets its configs
    as TMA: 4 candidates, all timed; the dQ Tuner picks first, and each two-kernel dK/dV
    candidate is timed with that dQ kernel after it, so that every candidate's time is a whole
    backward. A forced TMA: 4 runs no dQ kernel; its dQ meets the correctness rule, in fp16
    and bf16."""
    launches, seen, order = [], [], []
    monkeypatch.setattr(flash_bwd_gluon, "unsupported", lambda N, D, device=None: None)
    monkeypatch.setattr(flash_bwd_gluon, "gluon_launcher", _stand_in(launches))
    dq_runs = []
    real_launchers = flash_bwd_tma.tma_launchers

    def counting_launchers(*args):
        dkdv, dq = real_launchers(*args)

        def dq_counted(cfg):
            dq_runs.append(tuple(cfg))
            return dq(cfg)
        return dkdv, dq_counted

    monkeypatch.setattr(flash_bwd_tma, "tma_launchers", counting_launchers)

    class CountedKernel:  # the pointer-load dQ kernel, counted the same way
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            dq_runs.append(grid)
            return self.kernel[grid]

    monkeypatch.setattr(flash_bwd, "_bwd_dq_kernel", CountedKernel(flash_bwd._bwd_dq_kernel))
    for tuner, name in ((flash_bwd._dkdv_tuner, "dkdv"), (flash_bwd._dq_tuner, "dq")):
        def pick(key, candidates, launch, timed=None, _orig=tuner.pick, _name=name):
            order.append(_name)
            cands = list(candidates)
            seen.append((_name, cands, [c for c in cands if timed(c)]))
            if _name == "dkdv" and len(seen) == 2:  # what timing each form launches
                for form in (0, 1):
                    before = len(dq_runs)
                    launch(next(c for c in cands if c[-1] == form))
                    assert len(dq_runs) == before + 1
                before = len(launches)
                launch(GLUON[0])
                assert len(launches) == before + 1
            return _orig(key, cands, launch, timed=timed)
        monkeypatch.setattr(tuner, "pick", pick)
    B, H, N, D = 1, 1, 128, 128
    q, k, v, do = _qkv(B, H, N, D, dtype, seed=4, n=4)
    o, lse = flash_fwd.flash_forward(q, k, v, causal)
    flash_bwd.flash_backward(q, k, v, o, lse, do, causal)
    # dQ first (unlogged), dK/dV, then dQ again (its stored pick, logged): on the CPU the
    # dK/dV Tuner takes its first candidate, a two-kernel one
    assert order == ["dq", "dkdv", "dq"]
    _, dkdv_cands, dkdv_timed = seen[1]
    assert [c for c in dkdv_cands if c[-1] == 4] == GLUON
    assert set(GLUON) <= set(dkdv_timed)
    assert all(c[-1] != 4 for c in seen[0][1])  # the dQ Tuner never offers the one-pass form

    launches.clear()
    with tuning.forcing({"attention.flash_bwd.dkdv": {"TMA": 4, "num_stages": 2}}), \
            tuning.recording() as log:
        got = flash_bwd.flash_backward(q, k, v, o, lse, do, causal)
    assert launches == [(64, 128, 4, 2)]
    # a forced one-pass plan runs no dQ kernel: the dQ Tuner does not pick, the case's config
    # names only what ran; with a two-kernel plan the dQ pick is the case's too
    assert set(log.configs()) == {"attention.flash_bwd.dkdv"}
    with tuning.forcing({"attention.flash_bwd.dkdv": {"TMA": 1}}), tuning.recording() as log:
        flash_bwd.flash_backward(q, k, v, o, lse, do, causal)
    assert set(log.configs()) == {"attention.flash_bwd.dkdv", "attention.flash_bwd.dq"}
    # unforced, a one-pass candidate among the dK/dV ones: the dQ pick made before the plan
    # is known stays out of the log until a dQ kernel runs (on the CPU the dK/dV Tuner takes
    # its first candidate, a two-kernel one: logged then)
    order.clear()
    with tuning.recording() as log:
        flash_bwd.flash_backward(q, k, v, o, lse, do, causal)
    assert order == ["dq", "dkdv", "dq"]
    assert set(log.configs()) == {"attention.flash_bwd.dkdv", "attention.flash_bwd.dq"}
    launches.clear()
    dq_runs.clear()
    order.clear()
    flash_bwd.flash_backward(q, k, v, o, lse, do, causal, dkdv_config=GLUON[1])
    assert launches == [GLUON[1][:4]] and dq_runs == [] and order == []  # no dQ pick or kernel
    _backward_within_rule(got, q, k, v, do, causal, dtype)


def test_the_dq_tuner_takes_no_one_pass_config():
    q, k, v, do = _qkv(1, 1, 64, 16, torch.float16, n=4)
    o, lse = flash_fwd.flash_forward(q, k, v, False)
    with pytest.raises(ValueError, match="TMA=4 .* is a dK/dV form only"):
        flash_bwd.flash_backward(q, k, v, o, lse, do, False, dkdv_config=(16, 32, 4, 1, 0),
                                 dq_config=(32, 16, 4, 1, 4))


def test_a_forced_dq_config_rules_out_the_one_pass_plan(monkeypatch):
    """A dQ config forced (argument or YAML) is a dQ kernel to measure: the dK/dV Tuner then
    offers no one-pass candidate, and a one-pass plan forced beside it is an error naming
    both, not a silent choice of one."""
    monkeypatch.setattr(flash_bwd_gluon, "unsupported", lambda N, D, device=None: None)
    monkeypatch.setattr(flash_bwd_gluon, "gluon_launcher", _stand_in([]))
    seen = []
    orig = flash_bwd._dkdv_tuner.pick

    def pick(key, candidates, launch, timed=None):
        seen.append(list(candidates))
        return orig(key, candidates, launch, timed=timed)

    monkeypatch.setattr(flash_bwd._dkdv_tuner, "pick", pick)
    q, k, v, do = _qkv(1, 1, 128, 128, torch.float16, seed=6, n=4)
    o, lse = flash_fwd.flash_forward(q, k, v, False)
    with tuning.forcing({"attention.flash_bwd.dq": {"num_stages": 1}}):
        flash_bwd.flash_backward(q, k, v, o, lse, do, False)
    flash_bwd.flash_backward(q, k, v, o, lse, do, False, dq_config=flash_bwd.INTERPRETER_DQ)
    assert len(seen) == 2 and all(c[-1] != 4 for cands in seen for c in cands)
    flash_bwd.flash_backward(q, k, v, o, lse, do, False)
    assert any(c[-1] == 4 for c in seen[2])  # unforced: offered again
    for forcing, kwargs in (({"attention.flash_bwd.dkdv": {"TMA": 4},
                              "attention.flash_bwd.dq": {"num_stages": 1}}, {}),
                            ({}, {"dkdv_config": GLUON[0], "dq_config": flash_bwd.INTERPRETER_DQ})):
        with tuning.forcing(forcing), pytest.raises(ValueError, match="runs no dQ kernel, but "
                                                                      "a dQ config is forced"):
            flash_bwd.flash_backward(q, k, v, o, lse, do, False, **kwargs)


def test_launcher_zeroes_through_the_delta_kernel_and_copies_the_last_heads(monkeypatch):
    """The launcher's host side, with the kernel replaced: one scratch allocation split into the
    ring (ring * N, D) fp32 and 1 + 2*B*H int32 counters, handed to `zero_with` (the delta
    kernel) when given and zeroed otherwise; one program per (head, key tile); after the kernel,
    the last `ring` heads' dQ copied from slots 0 .. ring - 1 in q's dtype (the kernel casts the
    others itself: here the fake writes them)."""
    B, H, N, D = 2, 5, 256, 64
    monkeypatch.setattr(flash_bwd_gluon, "sm_count", lambda device: 4)  # a 4-SM GPU
    ring = flash_bwd_gluon.ring_slots(B, H, N, False, 4)
    assert 2 <= ring < B * H  # some heads cast in the kernel, some copied after it
    seen = {}

    class FakeKernel:
        def __getitem__(self, grid):
            def run(*args, **kw):
                dq, acc, sync, n, n_bh, ring_arg = args[-8:-2]
                seen.update(grid=grid, n=n, n_bh=n_bh, ring=ring_arg, acc_shape=tuple(acc.shape),
                            sync=(sync.dtype, sync.numel()), acc_zero=bool((acc == 0).all()),
                            sync_zero=bool((sync == 0).all()))
                rows = dq.view(n_bh, n * D)
                slots = acc.view(ring_arg, n * D)
                for h in range(n_bh):
                    if h < n_bh - ring_arg:
                        rows[h] = h  # the kernel's own cast
                    else:  # the documented slot of head h
                        slots[(h + n_bh * (ring_arg - 1)) % ring_arg] = h + 0.5
            return run

    monkeypatch.setattr(flash_bwd_gluon, "_flash_bwd_gluon_kernel", FakeKernel())
    q, k, v, do = _qkv(B, H, N, D, torch.bfloat16, n=4)
    lse, delta = torch.zeros(B, H, N), torch.zeros(B, H, N)
    dq, dk, dv = (torch.full_like(q, float("nan")) for _ in range(3))
    launch = flash_bwd_gluon.gluon_launcher(q, k, v, do, lse, delta, dq, dk, dv, False)
    zeroed = []

    def zero_with(acc, sync):
        zeroed.append((tuple(acc.shape), sync.dtype, sync.numel()))
        acc.zero_()
        sync.zero_()

    launch((64, 128, 4, 2), zero_with=zero_with)
    assert zeroed == [((ring * N, D), torch.int32, 1 + 2 * B * H)]
    assert seen["grid"] == ((N // 128) * B * H,) and seen["n"] == N and seen["n_bh"] == B * H
    assert seen["ring"] == ring and seen["acc_shape"] == (ring * N, D)
    assert seen["sync"] == (torch.int32, 1 + 2 * B * H)
    assert seen["acc_zero"] and seen["sync_zero"]
    want = torch.tensor([h if h < B * H - ring else h + 0.5 for h in range(B * H)])
    got = dq.view(B * H, -1).float()
    assert torch.equal(got, want[:, None].expand_as(got))
    seen.clear()
    launch((64, 128, 4, 3))  # no zero_with (the Tuners' timing launches): zeroed all the same
    assert seen["acc_zero"] and seen["sync_zero"]
