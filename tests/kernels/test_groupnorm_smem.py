"""groupnorm_mish's shared-memory form (SYNC 2, kernels/groupnorm_mish/smem_gluon.py) off the
GPU: a Gluon kernel does not run in the CPU interpreter, so CI checks its rules (which shapes
and configs it takes, its candidates, the register cap that keeps a group's programs resident),
that it is refused on the CPU with its reason (a forced YAML config fails the case, not the
run), and, in test_fused_ops.py's sm_90 build, that it compiles to TMA copies without spills.
Its numerics are checked on the GPU by the harness's check pass and
tools/device/groupnorm_smem_check.py."""
import re

import pytest
import torch

from harness import tuning
from harness.execute.correctness import check
from harness.registry import Params, get_op
from kernels.groupnorm_mish import candidates as cand
from kernels.groupnorm_mish import smem_gluon
from kernels.groupnorm_mish import triton_groupnorm_mish as tgm

OP = get_op("groupnorm_mish")


def test_shape_rules():
    ok = (0, 16, 2, 1, 2, 2)
    assert cand.smem_shape_error(ok, 10, 4096, 2) is None  # 80 KiB tile, two per SM
    for cfg, cpg, hw, item, text in (
            (ok, 10, 4000, 2, "H\\*W=4000 is not a multiple of 256"),
            (ok, 10, 4096, 4, "needs 167936 B .* 2 per SM"),  # fp32: 160 KiB, one per SM
            ((4096, 16, 2, 1, 2, 2), 10, 4096, 2, "BLOCK 0 or L / SPLIT"),
            ((0, 16, 1, 3, 2, 2), 10, 4096, 2, "SPLIT=3 must divide"),
            ((0, 16, 1, 1, 2, 4), 12, 3072, 2, "not whole chunks of ROWS=4 x num_warps=16"),
            ((0, 16, 3, 1, 2, 2), 10, 4096, 2, "STAGES x num_warps <= 32"),
            ((0, 4, 9, 2, 2, 2), 10, 4096, 2, "STAGES \\(programs per SM\\) is 1 to 8")):
        err = cand.smem_shape_error(cfg, cpg, hw, item)
        assert err is not None and re.search(text, err), (cfg, err)
    assert cand.smem_shape_error((40960, 16, 1, 1, 2, 2), 10, 4096, 4) is None  # BLOCK = L / S


def test_candidates():
    """The fewest tiles per group that fit, as many programs per SM as fit, then one per SM and
    twice the tiles; all valid; none where H*W is not whole rows; in configs() only when the
    form can run (smem_itemsize), after the two-pass ones, keeping the other forms' lists."""
    assert cand.smem_configs(10, 4096, 2, 132) == [
        (0, 16, 2, 1, 2, 2), (0, 16, 2, 1, 2, 1), (0, 16, 1, 1, 2, 2), (0, 8, 4, 2, 2, 2),
        (0, 4, 8, 4, 2, 2)]  # last: eight 4-warp programs per SM, 20 KiB tiles
    # 160 KiB tiles; then 2S and 4S tiles: two 80 KiB or four 40 KiB programs per SM; eight
    # of 20 KiB
    assert cand.smem_configs(10, 16384, 2, 132) == [
        (0, 16, 1, 2, 2, 2), (0, 16, 1, 2, 2, 1), (0, 16, 2, 4, 2, 2), (0, 8, 4, 8, 2, 2),
        (0, 4, 8, 16, 2, 2)]
    assert cand.smem_configs(10, 4096, 4, 132)[0] == (0, 16, 1, 1, 2, 2)  # fp32
    assert cand.smem_configs(10, 16384, 2, 1) == []  # S would exceed the SMs
    assert cand.smem_configs(3, 1000, 2, 132) == []
    for cpg, hw, item in ((10, 4096, 2), (20, 1024, 2), (10, 16384, 2), (10, 16384, 4),
                          (12, 3072, 2), (16, 1024, 4)):
        cfgs = cand.smem_configs(cpg, hw, item, 132)
        assert cfgs and len(set(cfgs)) == len(cfgs)
        assert all(cand.smem_shape_error(c, cpg, hw, item) is None for c in cfgs)
    for cpg, hw, groups in ((10, 4096, 512), (20, 1024, 1024), (10, 16384, 128),
                            (10, 16384, 32)):
        without = tgm.configs(cpg, hw, groups, 132, 64)
        with_smem = tgm.configs(cpg, hw, groups, 132, 64, 2)
        assert not any(c[4] == 2 for c in without)
        smem = [c for c in with_smem if c[4] == 2]
        assert smem == cand.smem_configs(cpg, hw, 2, 132)
        assert [c for c in with_smem if c[4] != 2] == without  # nothing else cut
        assert len(with_smem) <= tgm.MAX_CONFIGS
        last_two_pass = max(i for i, c in enumerate(with_smem) if c[3] == 0)
        assert with_smem.index(smem[0]) == last_two_pass + 1
    assert not any(c[4] == 2 for c in tgm.configs(2, 64, 8, 132, 64, 2))  # one tile: no loop


def test_register_cap():
    """STAGES programs share an SM's 64K registers: the build is capped at its share."""
    assert smem_gluon.launch_caps(16, 1) == {}
    assert smem_gluon.launch_caps(16, 2) == {"maxnreg": 64}
    assert smem_gluon.launch_caps(8, 4) == {"maxnreg": 64}
    assert smem_gluon.launch_caps(8, 3) == {"maxnreg": 80}
    assert smem_gluon.launch_caps(4, 8) == {"maxnreg": 64}


def test_unavailable_with_a_reason(monkeypatch):
    assert "GPU only" in smem_gluon.unsupported(torch.device("cpu"))
    gpu = torch.device("cuda")
    monkeypatch.setattr(smem_gluon, "interpreted", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "sm_90 or later); this GPU is sm_80" in smem_gluon.unsupported(gpu)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert smem_gluon.unsupported(gpu) is None
    monkeypatch.setattr(smem_gluon, "_triton_version", lambda: (3, 5))
    assert "needs triton >= 3.6" in smem_gluon.unsupported(gpu)


def test_forced_on_the_cpu_is_the_case_error():
    """A config forcing SYNC 2 on the CPU: the call raises the reason (the worker fails that
    case with it), and the Tuner never offers the form there."""
    x = torch.randn(2, 32, 16, 16)
    w, b = torch.ones(32), torch.zeros(32)
    with pytest.raises(ValueError, match=r"config \(0, 16, 2, 1, 2, 2\): .*GPU only"):
        tgm.groupnorm_mish(x, 4, w, b, config=(0, 16, 2, 1, 2, 2))
    p = Params(N=1, C=4, H=16, W=16, G=2)
    with tuning.forcing({"groupnorm_mish": {"SYNC": 2}}), \
            pytest.raises(ValueError, match="GPU only"):
        check(OP, OP.get_impl("triton"), p, "float16", "cpu")
    assert "SYNC" in tgm._tuner.fields and 2 in tgm._tuner.valid_values("SYNC")
    assert 0 in tgm._tuner.valid_values("BLOCK")
