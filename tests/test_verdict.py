"""Verdicts from what ncu counted, on REAL H200 captures (tests/fixtures/ncu/, Nsight Compute
2025.3.1; nothing in them was edited):
  flash_fwd_n4096_d128_7impls_raw.csv  the flash-attention-fwd ncu pass at B=4 H=16 N=4096 D=128
                                       fp16: naive (4 kernels), fused_mha, triton_flash, sdpa_*, ...
  softmax3_raw.csv                     the softmax ncu pass of tests/fixtures/capture.sh
  flash_bwd_n4096_d128_6impls_raw.csv  the flash-attention-bwd ncu pass at the same shape
  layernorm_raw.csv                    the layernorm experiment's ncu pass, the raw page the harness
                                       kept (runs/examples/20261122T031036Z-layernorm-884c/raw/ncu)
  sections_only_*_raw.csv              standard sections, no --metrics (capture_source.sh)
and the ceilings `harness calibrate` measured on that H200 (tests/fixtures/runs/.calibration).

Golden verdict lines: tests/fixtures/golden/verdicts_h200.txt. Regenerate after a reviewed change
    UPDATE_GOLDEN=1 python -m pytest tests/test_verdict.py -k golden
"""
import difflib
import json
import os
from pathlib import Path

import pandas as pd
import pytest

from harness import store
from harness.analysis.roofline import Ceilings
from harness.analysis.summary import ncu_case_view, summary_frame
from harness.analysis.validity import annotate
from harness.analysis.verdict import assess
from harness.profilers.ncu_parse import parse_raw_csv
from harness.registry import Params, get_op
from harness.present.report_context import VERDICT_ROOF
from harness.store.results import ITEMSIZE

FIX = Path(__file__).parent / "fixtures"
CAL = json.loads((FIX / "runs" / ".calibration" / "nvidia-h200.json").read_text())
CEIL = Ceilings.from_calibration(CAL)
FLASH = "flash_fwd_n4096_d128_7impls_raw.csv"
SHAPE = "B=4.H=16.N=4096.D=128.causal=false.mode=fwd.float16"
BWD = "flash_bwd_n4096_d128_6impls_raw.csv"  # the flash_bwd ncu pass, same shape (capture.sh)
BWD_SHAPE = SHAPE.replace("fwd", "bwd")
GOLDEN = [  # label, capture, op, case
    ("naive attention", FLASH, "attention", f"naive.{SHAPE}"),
    ("triton_flash", FLASH, "attention", f"triton_flash.{SHAPE}"),
    ("sdpa_cudnn", FLASH, "attention", f"sdpa_cudnn.{SHAPE}"),
    ("softmax", "softmax3_raw.csv", "softmax", "triton.M=8192.N=8192.float16"),
    ("layernorm", "layernorm_raw.csv", "layernorm", "triton.M=8192.N=4096.mode=fwd.float16"),
    ("naive attention bwd", BWD, "attention", f"naive.{BWD_SHAPE}"),
    ("sdpa_cudnn bwd", BWD, "attention", f"sdpa_cudnn.{BWD_SHAPE}"),
    ("triton_flash bwd", BWD, "attention", f"triton_flash.{BWD_SHAPE}"),
]


def parse_case_id(op, case_id: str) -> tuple[str, Params, str]:
    impl, *kv, dtype = case_id.split(".")
    params = {}
    for item in kv:
        k, v = item.split("=", 1)
        t = op.param(k).type
        params[k] = (v == "true") if t is bool else t(v)
    return impl, Params(params), dtype


def rows(capture: str) -> dict[str, dict]:
    view = ncu_case_view(parse_raw_csv((FIX / "ncu" / capture).read_text()))
    return {cid: dict(r, case_id=cid, dtype=cid.rsplit(".", 1)[1])
            for cid, r in view.to_dict("index").items()}


def judge_row(row: dict, op_name: str, ceil=CEIL):
    op = get_op(op_name)
    _, params, dtype = parse_case_id(op, row["case_id"])
    return assess(row, op.flop_count(params), op.byte_count(params, ITEMSIZE[dtype]), ceil,
                  True)[0]


def judged(capture: str, op_name: str, case_id: str, ceil=CEIL):
    return judge_row(rows(capture)[case_id], op_name, ceil)


def test_golden_verdicts():
    text = "".join(f"{label}: {judged(cap, op, case).text}\n" for label, cap, op, case in GOLDEN)
    path = FIX / "golden" / "verdicts_h200.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    want = path.read_text()
    if text != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True),
                                            "golden/verdicts_h200.txt", "judged"))
        pytest.fail(f"verdicts differ from the golden file (UPDATE_GOLDEN=1 after review):\n{diff}")
    assert all("\n" not in line for line in text.splitlines())  # one line each


def test_naive_attention_is_judged_on_its_traffic():
    j = judged(FLASH, "attention", f"naive.{SHAPE}")
    # Q, K, V, O are 268 MB; the N x N scores go through HBM several times: 13 GB counted
    assert j.excess == pytest.approx(48.8, abs=0.1)
    assert j.lever.startswith("traffic: 48.8x the minimum bytes moved")
    assert "keep the tensor cores fed" not in j.text
    assert "counted placement: 45 FLOP/B" in j.text  # counted bytes, not the analytic 2,048
    assert "dominant kernel cunn_SoftMaxForwardReg (60% of the time)" in j.text
    assert "4 kernels, duration-weighted" in j.text


def test_flash_kernels_move_the_minimum_and_get_the_overlap_lever_not_occupancy():
    for impl in ("triton_flash", "sdpa_flash", "sdpa_efficient"):
        j = judged(FLASH, "attention", f"{impl}.{SHAPE}")
        assert 0.9 < j.excess < 1.1, impl
        assert j.bound == "latency", impl
        assert j.lever.startswith("overlap softmax/epilogue with the MMAs"), impl
        assert "raise occupancy" not in j.text and "MMA kernel" in j.text, impl
    j = judged(FLASH, "attention", f"triton_flash.{SHAPE}")
    assert "SM 51%, memory 45%, DRAM 5%, all < 60%" in j.text
    assert "tensor pipe 51%" in j.text and "top stalls barrier 1.2" in j.text


def test_cudnn_attention_is_at_the_tensor_core_roof():
    j = judged(FLASH, "attention", f"sdpa_cudnn.{SHAPE}")
    assert j.bound == "compute" and "tensor pipe 73%" in j.text
    assert j.lever.startswith("at the tensor-core roof: done")


def test_memory_bound_kernels_done_at_the_roof_or_more_bytes_in_flight():
    soft = judged("softmax3_raw.csv", "softmax", "triton.M=8192.N=8192.float16")
    assert soft.bound == "memory" and soft.excess == pytest.approx(0.91, abs=0.01)
    assert soft.lever.startswith("at the memory roof: done (91% of the measured copy rate")
    ln = judged("layernorm_raw.csv", "layernorm", "triton.M=8192.N=4096.mode=fwd.float16")
    assert ln.bound == "memory" and "80% of the DRAM roof" in ln.text  # under 85%: not done
    assert ln.lever.startswith("more bytes in flight")
    # the split-row path reads its input twice: traffic, not the roof
    two = judged("softmax3_raw.csv", "softmax", "triton.M=256.N=262144.float16")
    assert two.excess == pytest.approx(1.43, abs=0.01) and two.lever.startswith("traffic: 1.43x")


def test_kernel_class_comes_from_the_tensor_pipe_counter_not_the_impl_name():
    row = rows(FLASH)[f"triton_flash.{SHAPE}"]
    renamed = dict(row, case_id=f"naive.{SHAPE}", dominant_kernel="softmax_rows")
    assert judge_row(renamed, "attention").text == judge_row(row, "attention").text
    no_mma = dict(row, tensor_pipe_pct=0.3, case_tensor_pipe_pct=0.3)
    j = judge_row(no_mma, "attention")
    assert "no MMA (tensor pipe 0%)" in j.text and not j.lever.startswith("overlap")


def test_occupancy_is_a_lever_only_for_a_latency_bound_non_mma_kernel():
    row = rows("layernorm_raw.csv")["triton.M=8192.N=4096.mode=fwd.float16"]
    # the same kernel as if it were latency-bound at low theoretical occupancy
    slow = dict(row, **{f"{p}{k}": 40.0 for p in ("", "case_") for k in
                        ("sm_throughput_pct", "memory_throughput_pct", "dram_throughput_pct")},
                theoretical_occupancy_pct=25.0, achieved_occupancy_pct=24.0)
    j = judge_row(slow, "layernorm")
    assert j.bound == "latency"
    assert j.lever == "raise occupancy: cut registers per thread (smaller tiles, fewer stages)"
    assert "occupancy 24% of 25% (limit: registers)" in j.text
    mma = dict(slow, tensor_pipe_pct=40.0, case_tensor_pipe_pct=40.0)
    assert judge_row(mma, "layernorm").lever.startswith("overlap softmax/epilogue")


@pytest.mark.parametrize("capture,op,case,bound,lever", [
    ("sections_only_flash_raw.csv", "attention", f"triton_flash.{SHAPE}", "latency",
     "overlap softmax/epilogue with the MMAs"),
    ("sections_only_softmax_raw.csv", "softmax", "triton.M=8192.N=8192.float16", "memory",
     "at the memory roof: done (80% of peak DRAM, bytes not counted)"),
])
def test_sections_only_captures_are_judged_from_the_gpu_dram_alias(capture, op, case, bound,
                                                                   lever):
    j = judged(capture, op, case)
    assert j.excess is None and "traffic" not in j.text and j.placement is None
    assert j.bound == bound and j.lever.startswith(lever)
    assert "DRAM" in j.text.split(";")[0]  # gpu__dram_throughput was read


def test_without_ncu_the_verdict_is_the_analytic_placement():
    row = {"case_id": "triton.M=8192.N=8192.float16", "dtype": "float16", "median_ms": 0.0691}
    j = judge_row(row, "softmax")
    assert j.text.startswith("memory-bound at 92% of the DRAM roof (analytic placement, no ncu)")
    assert j.bound is None  # no ncu breakdown: no limiter, only the placement's side
    assert j.lever.startswith("at the memory roof: done")
    assert VERDICT_ROOF.sub(r"\1-bound", j.text).startswith(
        "memory-bound (analytic placement, no ncu)")  # the report's % column keeps the number
    assert judge_row({**row, "median_ms": None}, "softmax").text == "no roofline or profiler data"


def flash_run(tmp_path: Path) -> Path:
    """A run holding the real ncu metrics of the 7-impl flash capture (no timings)."""
    metrics = parse_raw_csv((FIX / "ncu" / FLASH).read_text())
    op = get_op("attention")
    cases = []
    for cid in dict.fromkeys(metrics.case_id):
        impl, params, dtype = parse_case_id(op, cid)
        cases.append({"case_id": cid, "op": "attention", "impl": impl,
                      "role": "baseline" if impl == "naive" else "candidate",
                      "params": json.dumps(dict(params)), "dtype": dtype, "status": "ok",
                      "error": None, "shape_id": SHAPE})
    run = store.create_run(tmp_path, "flash", {
        "experiment": {"name": "flash", "op": "attention", "baseline": "naive"},
        "device": "cuda", "calibration": CAL,
        "env": {"device": "cuda", "gpu_name": "NVIDIA H200"}, "passes": {"ncu": "done"}})
    store.write_table(run, "cases", pd.DataFrame(cases))
    store.write_table(run, "results", pd.DataFrame({"case_id": [c["case_id"] for c in cases]}))
    store.write_table(run, "metrics", metrics)
    return run


def test_annotate_stores_excess_traffic_as_a_derived_metric_once(tmp_path):
    run = flash_run(tmp_path)
    res = annotate(run, get_op("attention")).set_index("case_id")
    assert res.loc[f"naive.{SHAPE}", "verdict"] == judged(FLASH, "attention",
                                                          f"naive.{SHAPE}").text
    assert res.loc[f"triton_flash.{SHAPE}", "limiter"] == "latency"
    assert res.bound.isna().all()  # the analytic placement needs an events median: none here
    annotate(run, get_op("attention"))  # again: replaces, never duplicates
    m = store.load_metrics(run)
    ex = m[(m.source == "derived") & (m.name == "excess_traffic")]
    assert sorted(ex.case_id) == sorted(res.index) and (ex.kernel == "").all()
    assert len(m[m.source == "ncu"]) == len(parse_raw_csv((FIX / "ncu" / FLASH).read_text()))
    by_case = ex.set_index("case_id").value
    assert by_case[f"naive.{SHAPE}"] > 40 and 0.9 < by_case[f"triton_flash.{SHAPE}"] < 1.1
    df = summary_frame(run).set_index("case_id")
    assert df.loc[f"naive.{SHAPE}", "excess_traffic"] == pytest.approx(by_case[f"naive.{SHAPE}"])


def test_show_and_dashboard_carry_the_new_verdict(tmp_path):
    from rich.console import Console

    from dashboard.data import summary_table
    from harness.present import show

    run = flash_run(tmp_path)
    annotate(run, get_op("attention"))
    console = Console(record=True, width=4000)
    show.render(run, console)
    out = console.export_text()
    naive = judged(FLASH, "attention", f"naive.{SHAPE}").text
    assert f"verdict naive.{SHAPE}: {naive}" in out
    table = summary_table(summary_frame(run), cpu=False)
    row = table[table.impl == "naive"].iloc[0]
    assert row["verdict"] == naive and row["traffic x min"] == pytest.approx(48.8, abs=0.1)
    assert row["limit (ncu)"] == "compute"
