"""The fused-op experiment files: they load, their smoke sweeps stay interpreter-sized, their GPU
sweeps reach >= 64 MiB working sets, their ncu globs select one large case per implementation;
and one end-to-end CLI run of a smoke sweep in a subprocess."""
import fnmatch
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness import store

from harness.experiment import spec
from harness.execute.correctness import TORCH_DTYPES
from harness.registry import Params, get_op

ROOT = Path(__file__).resolve().parents[2]
YAMLS = ["vector_add", "layernorm", "layernorm_bwd", "add_layernorm", "linear_gelu", "mlp",
         "groupnorm_mish"]
MEMORY_BOUND = {"vector_add", "layernorm", "add_layernorm", "groupnorm_mish"}


@pytest.mark.parametrize("name", YAMLS)
def test_experiment_file(name):
    exp = spec.load(ROOT / "experiments" / f"{name}.yaml")
    op = get_op(exp.op)
    cases = spec.expand(exp)
    smoke = spec.expand(exp, smoke=True)
    assert {"torch", "torch_compile", "triton"} <= set(exp.impl_names())
    assert exp.baseline == "torch"
    assert 100 <= exp.timing.rep_ms <= 200
    assert len(cases) <= 40, "keep the GPU run short"
    # every GPU shape moves a working set of at least 64 MiB (bytes of the op's floor), but
    # groupnorm_mish's batch-1 SDXL shape (20 MiB: 32 groups, the split form's case; the report
    # places it against a copy of its own size)
    for c in cases:
        if name == "groupnorm_mish" and ".N=1." in c.case_id:
            continue
        itemsize = TORCH_DTYPES[c.dtype].itemsize
        assert op.byte_count(Params(c.params_dict), itemsize) >= 64 * 2 ** 20, c.case_id
    # smoke shapes are interpreter-sized
    for c in smoke:
        p = Params(c.params_dict)
        assert op.byte_count(p, 4) < 4 * 2 ** 20, c.case_id
    # the ncu globs select one large case for each implementation, fp16
    globs = exp.profile.ncu.cases
    assert isinstance(globs, list)
    chosen = [c for c in cases if any(fnmatch.fnmatchcase(c.case_id, g) for g in globs)]
    assert {c.impl for c in chosen} == set(exp.impl_names())
    assert all(c.dtype == "float16" for c in chosen)
    assert exp.profile.nsys is not None and exp.profile.nsys.enabled
    if exp.op in MEMORY_BOUND:
        assert op.primary == "gbps"
    else:
        assert op.primary == "tflops"


@pytest.mark.slow
def test_cli_smoke_run_layernorm_bwd(tmp_path):
    """The whole pipeline on the CPU: spec -> worker passes (check, time) -> stored run; the
    backward goes through the op's binder (autograd.grad of a forward done beforehand).
    torch_compile is left out: Inductor's CPU backward build costs a minute, and the binder
    is the same for every implementation (torch.compile runs in the flash smoke run)."""
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run", str(ROOT / "experiments" / "layernorm_bwd.yaml"),
         "--store", str(tmp_path), "--cases", "torch.*,triton.*"], cwd=ROOT,
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    cases = store.load_cases(run_dir)
    results = store.load_results(run_dir)
    assert len(cases) == 4 and set(cases.impl) == {"torch", "triton"}
    merged = cases.merge(results, on="case_id")
    assert (merged.status == "ok").all(), merged[["case_id", "status", "error"]].to_string()
    assert merged.correct.astype(bool).all()
    assert pd.notna(merged.median_ms).all()
    assert all(json.loads(p)["mode"] == "bwd" for p in cases.params)


@pytest.mark.slow
def test_kernels_build_for_sm90():
    """The interpreter does not compile; this builds the first configuration of each fused-op
    kernel for sm_90 with the wheel's ptxas (no GPU needed) and checks wgmma/vector codegen."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, "-m", "kernels.layernorm.fused_aot_check", "--quick"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = {ln.split()[0]: ln for ln in proc.stdout.splitlines() if "regs" in ln}
    assert set(lines) == {"vector_add", "layernorm", "add_layernorm", "layernorm_bwd", "matmul",
                          "matmul_tma", "mlp_fused", "groupnorm_mish"}
    for mma in ("matmul", "matmul_tma", "mlp_fused"):
        assert "wgmma   0" not in lines[mma], lines[mma]
    # the TMA matmul really moves its tiles with TMA; the pointer kernel does not
    assert "tma 0" not in lines["matmul_tma"] and lines["matmul"].endswith("tma 0")
    assert "v4 ld/st 0" not in lines["vector_add"] and "v4 ld/st 0" not in lines["layernorm"]
    # groupnorm_mish's shared-memory form (Gluon) moves its tiles with TMA, within its
    # register cap (two 16-warp programs per SM) and without spills
    smem = [ln for ln in proc.stdout.splitlines() if " smem 1x40960 " in ln]
    assert smem and "tma 0" not in smem[0] and " spill stack    0 B" in smem[0], smem
    assert int(smem[0].split(" regs ")[1].split()[0]) <= 64, smem[0]


def test_stages_pipeline_the_row_and_tile_loops_for_sm90():
    """STAGES > 1 must really software-pipeline the loops (their loads become cp.async copies
    into shared memory), and STAGES = 1 must not: built for sm_90 with the wheel's ptxas."""
    import os

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        # @triton.jit gives Python functions under the interpreter: build in a subprocess
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_DEFAULT_FP_FUSION"] = "1"
        proc = subprocess.run([sys.executable, "-c", "import tests.kernels.test_fused_ops as t; "
                               "t._assert_pipelined_builds()"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    else:
        _assert_pipelined_builds()


def _assert_pipelined_builds():
    from kernels.layernorm.fused_aot_check import build
    from kernels.groupnorm_mish import triton_groupnorm_mish as tgm
    from kernels.layernorm import triton_layernorm_bwd as tlb

    gn = {"x_ptr": "*fp16", "w_ptr": "*fp16", "b_ptr": "*fp16", "y_ptr": "*fp16", "CPG": "i32",
          "G": "i32", "eps": "fp32"}
    lb = {"x_ptr": "*fp16", "dy_ptr": "*fp16", "w_ptr": "*fp16", "mean_ptr": "*fp32",
          "rstd_ptr": "*fp32", "dx_ptr": "*fp16", "dwp_ptr": "*fp32", "dbp_ptr": "*fp32",
          "M": "i32", "N": "i32", "x_stride": "i32", "dy_stride": "i32", "dx_stride": "i32",
          "rows_per_prog": "i32"}
    for stages in (1, 3):
        g = build(tgm._gn_mish, "groupnorm_mish", "", gn,
                  {"HW": 4096, "CB": 1, "HB": 4096, "NHT": 1, "ONE_TILE": False,
                   "STAGES": stages, "FAST": True}, 8)
        b = build(tlb._ln_bwd_rows, "layernorm_bwd", "", lb,
                  {"ROWS": 1, "BLOCK_N": 4096, "STAGES": stages, "PDL": True}, 8,
                  aligned=("N", "x_stride", "dy_stride", "dx_stride"))
        for k in (g, b):
            assert (k.cp_async > 0) == (stages > 1), (k, stages)
            assert k.stack == 0, k
    # groupnorm's flat first pass: a thread's ROWS 16-byte vectors of a step come from one load
    # (the tiled pass takes 2 per tile here: 4096 elements over 256 threads)
    tiled = build(tgm._gn_mish, "groupnorm_mish", "", gn,
                  {"HW": 4096, "CB": 1, "HB": 4096, "NHT": 1, "ONE_TILE": False, "STAGES": 1,
                   "FAST": True, "ROWS": 0, "COLS": 2048}, 8)
    for rows in (2, 4):
        f = build(tgm._gn_mish, "groupnorm_mish", "", gn,
                  {"HW": 4096, "CB": 1, "HB": 4096, "NHT": 1, "ONE_TILE": False, "STAGES": 1,
                   "FAST": True, "ROWS": rows, "COLS": 2048}, 8)
        assert f.vec16 == tiled.vec16 - 2 + rows, (rows, f, tiled)
        assert f.stack == 0 and f.cp_async == 0, f
    # the backward's two kernels as a programmatic dependent launch: the rows kernel lets the
    # column sum launch, the column sum waits for it (griddepcontrol), and neither without PDL
    cs = {"dwp_ptr": "*fp32", "dbp_ptr": "*fp32", "dw_ptr": "*fp16", "db_ptr": "*fp16",
          "P": "i32", "N": "i32"}
    for pdl in (True, False):
        c = build(tlb._ln_bwd_colsum, "layernorm_bwd", "", cs,
                  {"BLOCK_P": 512, "BLOCK_C": 8, "PDL": pdl}, 4, aligned=("N",))
        r = build(tlb._ln_bwd_rows, "layernorm_bwd", "", lb,
                  {"ROWS": 1, "BLOCK_N": 1024, "STAGES": 1, "PDL": pdl}, 1,
                  aligned=("N", "x_stride", "dy_stride", "dx_stride"))
        assert (c.gdc, r.gdc) == ((1, 1) if pdl else (0, 0)), (pdl, c, r)
