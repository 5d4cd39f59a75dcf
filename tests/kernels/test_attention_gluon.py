"""The Gluon FA3-form forward (kernels/attention/flash_fwd_gluon.py) off the GPU: Gluon kernels
do not run in the CPU interpreter, so what CI checks is the plumbing (the forward Tuner's TMA: 4
candidates and launches, the reasons it is unavailable, the config rule) and, in
test_attention.py's sm_90 build, that the kernel compiles without spills. Its numerics are
checked on the GPU by the harness's check pass (every triton_flash case of
experiments/flash.yaml) and tools/device/gluon_fwd_check.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import kernels._common
import kernels._gluon

from harness import tuning
from harness.execute.correctness import check
from kernels.attention import flash_fwd, flash_fwd_gluon, flash_fwd_tma
from test_attention import OP, ROOT, _qkv, _within_rule
from test_attention import _params as attention_params
from kernels.attention import reference as ref


def test_unavailable_on_the_cpu_with_a_reason():
    cpu = torch.device("cpu")
    assert "GPU only" in flash_fwd_gluon.unsupported(4096, 128, cpu)
    q = torch.zeros(1, 1, 128, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"TMA=4, but Gluon kernels run on a GPU only"):
        flash_fwd.flash_forward(q, q, q, False, config=(128, 128, 4, 2, 4))


def test_forced_on_the_cpu_is_the_case_error():
    """A YAML variant forcing TMA: 4 off Hopper: the case's check raises the reason (the worker
    fails that case with it, the run goes on)."""
    with tuning.forcing({"attention.flash_fwd": {"TMA": 4}}), \
            pytest.raises(ValueError, match="TMA=4, but Gluon kernels run on a GPU only"):
        check(OP, OP.get_impl("triton_flash"), attention_params(N=128, D=64, mode="fwd"),
              "float16", "cpu")


def test_shape_and_config_rules(monkeypatch):
    """On a (faked) GPU: Hopper only, D 64/128, N a multiple of 128; configs within the
    kernel's fixed fields and shared memory."""
    gpu = torch.device("cuda")
    monkeypatch.setattr(kernels._common, "interpreted", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert flash_fwd_gluon.unsupported(4096, 128, gpu) is None
    assert "multiple of 128, got N=4000" in flash_fwd_gluon.unsupported(4000, 128, gpu)
    assert "head dim 64 or 128, got D=32" in flash_fwd_gluon.unsupported(4096, 32, gpu)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "Hopper's wgmma (sm_90); this GPU is sm_80" in flash_fwd_gluon.unsupported(4096, 128,
                                                                                        gpu)
    monkeypatch.setattr(kernels._gluon, "triton_version", lambda: (3, 5))
    assert "needs triton >= 3.6" in flash_fwd_gluon.unsupported(4096, 128, gpu)
    assert flash_fwd_gluon.configs_for(128, 4096) == flash_fwd_gluon.GLUON_CONFIGS[128]
    assert flash_fwd_gluon.configs_for(64, 4160) == []
    # 192-row tiles (D=64) overhang N = 4096 = 21 x 192 + 64: offered all the same
    assert (192, 128, 4, 3) in flash_fwd_gluon.configs_for(64, 4096)
    assert flash_fwd_gluon.configs_for(64, 4096) == flash_fwd_gluon.GLUON_CONFIGS[64]
    with pytest.raises(ValueError, match="BLOCK_M 192 .* takes D=64 only"):
        flash_fwd_gluon.check_config((192, 128, 4, 2), 128)
    assert flash_fwd_gluon.smem_bytes((192, 128, 4, 3), 64) == 2 * (192 * 64 + 3 * 2 * 128 * 64)
    # the Tuner's rules: BLOCK_M 192 with 128-row key tiles, and only for the Gluon form
    assert flash_fwd._tuner.violated({"BLOCK_M": 192, "BLOCK_N": 128, "TMA": 4}) is None
    assert "Gluon kernel's (TMA 4) only" in flash_fwd._tuner.violated({"BLOCK_M": 192, "TMA": 1})
    assert "BLOCK_M % BLOCK_N" in flash_fwd._tuner.violated({"BLOCK_M": 128, "BLOCK_N": 96})
    for D, cfgs in flash_fwd_gluon.GLUON_CONFIGS.items():
        for cfg in cfgs:
            flash_fwd_gluon.check_config(cfg, D)
    flash_fwd_gluon.check_config((128, 128, 4, 4), 64)  # 144 KiB
    for cfg, field in (((64, 128, 4, 2), "BLOCK_M is 128"), ((128, 128, 8, 2), "num_warps is 4"),
                       ((128, 32, 4, 2), "BLOCK_N is 64 or 128"),
                       ((128, 128, 4, 1), "num_stages .* 2 to 4"),
                       ((128, 128, 4, 4), "need 294912 B of shared memory")):
        with pytest.raises(ValueError, match=field):
            flash_fwd_gluon.check_config(cfg, 128)
    assert flash_fwd.uses_tma((128, 128, 4, 2, 4))


@pytest.mark.parametrize("causal", [False, True])
def test_tuner_times_the_gluon_form_where_it_runs(causal, monkeypatch):
    """Where the Gluon form is available (a Hopper GPU; here faked, its launch standing in with
    the TMA kernel's interpreter tile) the forward Tuner gets its configs as TMA: 4 candidates,
    among those `timed` accepts (what a GPU would time), and a forced TMA: 4 reaches its
    launcher."""
    launches = []

    def fake_launcher(q, k, v, o, lse, causal_):
        tma = flash_fwd_tma.tma_launcher(q, k, v, o, lse, causal_)

        def launch(cfg, overlap=True, pingpong=False):
            flash_fwd_gluon.check_config(cfg, q.shape[-1])
            launches.append(tuple(cfg))
            tma(flash_fwd_tma.INTERPRETER_CONFIG)
        return launch

    monkeypatch.setattr(flash_fwd_gluon, "unsupported", lambda N, D, device=None: None)
    monkeypatch.setattr(flash_fwd_gluon, "gluon_launcher", fake_launcher)
    seen = []
    orig = flash_fwd._tuner.pick

    def pick(key, candidates, launch, timed=None):
        seen.append(([c for c in candidates], [c for c in candidates if timed(c)]))
        return orig(key, candidates, launch, timed=timed)

    monkeypatch.setattr(flash_fwd._tuner, "pick", pick)
    q, k, v = _qkv(1, 2, 128, 64, torch.float16, seed=3)
    flash_fwd.flash_forward(q, k, v, causal)
    cands, timed = seen[0]
    gluon = [c for c in cands if c[-1] == 4]
    assert [c[:4] for c in gluon] == flash_fwd_gluon.GLUON_CONFIGS[64]
    assert set(gluon) <= set(timed) and all(c[-1] in (1, 3, 4) for c in timed)
    with tuning.forcing({"attention.flash_fwd": {"TMA": 4, "num_stages": 3}}):
        o, lse = flash_fwd.flash_forward(q, k, v, causal)
    assert launches == [(128, 128, 4, 3)]
    with tuning.forcing({"attention.flash_fwd": {"BLOCK_M": 192, "TMA": 4}}):
        flash_fwd.flash_forward(q, k, v, causal)
    assert launches[-1] == (192, 128, 4, 2)  # the three-warpgroup tile reaches the launcher
    _within_rule(o, (q, k, v), lambda a, b, c: ref.reference_forward(a, b, c, causal=causal))


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_three_warpgroup_tile_builds_for_sm90(causal):
    """BLOCK_M 192 (D=64) builds for sm_90 as 16 warps: three 4-warp consumers and the
    producer's warpgroup, 128 registers per thread at launch (setmaxnreg re-divides them:
    3 x 160 + 24), with a third more wgmmas than the two-warpgroup tile. The non-causal build
    does not spill; the causal one spills a few words in this machine's triton 3.9 build (88
    bytes of stack; the GPU box's triton 3.6 build reports none: run ...-0275's compiled
    kernels), and measured faster than the 128-row tile on an H100 all the same."""
    code = ("import json, sys; from kernels.attention.aot_check import build_gluon as b; "
            "print(json.dumps([vars(b(64, sys.argv[1] == '1', c)) "
            "for c in ((128, 128, 4, 2), (192, 128, 4, 2))]))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # a real build
    proc = subprocess.run([sys.executable, "-c", code, str(int(causal))], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two, three = json.loads(proc.stdout.strip().splitlines()[-1])
    assert three["regs"] == 128 and two["regs"] == 168
    assert three["wgmma"] == 3 * two["wgmma"] // 2
    assert three["smem_bytes"] >= flash_fwd_gluon.smem_bytes((192, 128, 4, 2), 64)
    if not causal:
        assert three["stack"] == 0


@pytest.mark.parametrize("D, cfg, causal, grid, heads_first", [
    (64, (192, 128, 4, 2), True, (6, 22), True),  # 4096 = 21 x 192 + 64: 22 tiles, heads first
    (64, (192, 128, 4, 3), False, (22, 6), False),
    (64, (128, 128, 4, 2), True, (32, 6), False),
    (128, (128, 128, 4, 2), True, (32, 6), False),
])
def test_launch_grid_and_parts(D, cfg, causal, grid, heads_first, monkeypatch):
    """What the launcher hands the kernel (the kernel itself replaced: Gluon needs a GPU): the
    grid covers N with whole tiles (a 192-row tile overhangs N = 4096), the consumer count and
    registers follow BLOCK_M, and causal three-warpgroup launches walk the heads first."""
    launched = []

    class Kernel:
        def __getitem__(self, g):
            return lambda *args, **kw: launched.append((g, kw))

    monkeypatch.setattr(flash_fwd_gluon, "_flash_fwd_gluon_kernel", Kernel())
    q = torch.zeros(2, 3, 4096, D, dtype=torch.float16)  # only shapes and types are read
    lse = torch.zeros(2, 3, 4096)
    flash_fwd_gluon.gluon_launcher(q, q, q, q, lse, causal)(cfg)
    (g, kw), = launched
    assert g == grid and kw["HEADS_FIRST"] is heads_first
    assert kw["NUM_WG"] == cfg[0] // 64 and kw["CONSUMER_REGS"] == (160 if cfg[0] == 192 else 240)
    assert (kw["BLOCK_N"], kw["STAGES"], kw["CAUSAL"]) == (cfg[1], cfg[3], causal)
