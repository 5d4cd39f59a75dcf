"""The CLI end to end on the CPU: real subprocesses, real worker processes, real parquet."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from cli_inproc import run_cli

from harness import store

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
       "HARNESS_OPS": "harness_test_ops", "COLUMNS": "200"}


def harness(*args, check=False):
    """`python -m harness ARGS` (in this process: tests/cli_inproc.py), with the test op."""
    p = run_cli(args, env=ENV)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def only_run(root: Path) -> Path:
    runs = [d for d in root.iterdir() if (d / "manifest.json").exists()]
    assert len(runs) == 1, runs
    return runs[0]


@pytest.mark.slow
def test_softmax_smoke_run_on_cpu(tmp_path):
    p = harness("run", "experiments/softmax.yaml", "--store", str(tmp_path), "--reprofile",
                check=True)
    run = only_run(tmp_path)
    assert p.stdout.strip().splitlines()[-1] == f"run stored at {run.relative_to(ROOT) if run.is_relative_to(ROOT) else run}"
    assert "No CUDA device" in p.stdout and "smoke sweep" in p.stdout
    assert "ncu, nsys: skipped: no CUDA device" in p.stdout
    m = store.load_manifest(run)
    assert m["status"] == "complete" and m["device"] == "cpu" and m["smoke"] is True
    assert m["env"]["torch"] and m["spec_hash"] and m["command"][:4] == ["python", "-m",
                                                                         "harness", "run"]
    assert m["reprofile"] is True  # no profile carried over from an earlier run
    # what `show` and `report` need of the op, so that they import no kernel (harness.op_card)
    assert m["op_card"]["primary"] == "gbps"
    assert m["op_card"]["impls"]["triton"]["backend"] == "triton"
    cases, results = store.load_cases(run), store.load_results(run)
    assert len(cases) == 6 and set(cases.status) == {"ok"}
    assert results.correct.all() and (results.clock == "cpu_wall").all()
    samples = store.load_samples(run)
    assert samples.groupby("case_id").size().min() >= 2  # CPU: a warm-up call, then >= 2
    js = json.loads(harness("show", str(run), "--format", "json", check=True).stdout)
    assert js["run_id"] == run.name and len(js["cases"]) == 6
    assert all(c["correct"] for c in js["cases"])
    # show --out: the older spelling of --store, still accepted
    table = harness("show", run.name, "--out", str(tmp_path), check=True).stdout
    assert "triton" in table and "✓" in table


def _exp(tmp_path, impls, extra=""):
    path = tmp_path / "e.yaml"
    path.write_text(f"name: selftest\nop: scale2\nbaseline: torch\ncandidates: {impls}\n"
                    f"sweep: {{N: [64, 1000]}}\ndtypes: [float32]\n"
                    f"timing: {{rep_ms: 20, min_samples: 3}}\n{extra}")
    return path


@pytest.mark.slow
def test_a_failing_or_crashing_kernel_fails_its_case_not_the_run(tmp_path):
    exp = _exp(tmp_path, "[segfault, raises, zeros, gpu_only, slow]")
    out = tmp_path / "runs"
    p = harness("run", str(exp), "--store", str(out), check=True)
    run = only_run(out)
    cases = store.load_cases(run).set_index("case_id")
    res = store.load_results(run).set_index("case_id")
    st = cases.status.to_dict()
    assert st["torch.N=64.float32"] == "ok" and st["slow.N=1000.float32"] == "ok"
    assert st["segfault.N=64.float32"] == "error"
    assert "worker died (signal SIGSEGV)" in cases.error["segfault.N=64.float32"]
    assert st["raises.N=1000.float32"] == "error"
    assert "deliberate failure" in cases.error["raises.N=1000.float32"]
    assert st["zeros.N=64.float32"] == "failed"
    assert st["gpu_only.N=64.float32"] == "skipped"
    assert cases.error["gpu_only.N=64.float32"] == "needs a CUDA device"
    assert pd.isna(res.speedup_vs_baseline["zeros.N=64.float32"])  # no speedup for wrong ones
    assert res.speedup_vs_baseline["slow.N=64.float32"] > 0
    assert res.speedup_vs_baseline["torch.N=64.float32"] == pytest.approx(1.0)
    assert "worker died" in p.stdout


@pytest.mark.slow
def test_ctrl_c_leaves_a_readable_partial_run_and_resume_finishes_it(tmp_path):
    exp = _exp(tmp_path, "[slow]")
    out = tmp_path / "runs"
    env = {**ENV, "HARNESS_TEST_SLOW_S": "0.5"}
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", str(exp), "--store", str(out)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        runs = [d for d in out.iterdir()] if out.exists() else []
        if runs and store.read_parts(runs[0], "check"):
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    text, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, text
    run = only_run(out)
    assert store.load_manifest(run)["status"] == "interrupted"
    assert "--resume" in text
    partial = store.load_cases(run)
    assert (partial.status == "pending").any()
    assert harness("show", str(run)).returncode == 0  # readable as it is
    p = harness("run", "--resume", run.name, "--store", str(out), check=True)
    assert "resuming run" in p.stdout
    assert store.load_manifest(run)["status"] == "complete"
    assert set(store.load_cases(run).status) == {"ok"}


@pytest.mark.parametrize("args, expected", [
    (["run", "experiments/nope.yaml"], "no such experiment file"),
    (["run", "EXP", "--cases", "zzz*"], "--cases: 'zzz*' matches no case"),
    (["show", "no-such-run"], "run 'no-such-run' not found"),
    (["run"], "missing experiment file"),
])
def test_user_errors_are_one_line_exit_2_and_write_nothing(tmp_path, args, expected):
    exp = _exp(tmp_path, "[zeros]")
    args = [str(exp) if a == "EXP" else a for a in args]
    out = tmp_path / "runs"
    p = harness(*args, "--store", str(out))
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], p.stderr
    assert not out.exists() or not any(out.iterdir())


def test_bad_yaml_via_cli(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nop: softmax\nbaseline: torch\nsweep: {M: [1], N: [\"big\"]}\n")
    p = harness("run", str(bad), "--store", str(tmp_path / "runs"))
    assert p.returncode == 2
    assert p.stderr.strip() == f"error: {bad}: sweep.N[0]: expected integer, got 'big'"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("verb", [["run", "e.yaml"], ["show", "R"], ["list"], ["compare", "A", "B"],
                                  ["report", "R"], ["import", "x.csv"], ["calibrate"],
                                  ["doctor"], ["dashboard"]])
def test_every_verb_takes_the_store_as_store(verb):
    from harness.cli import build_parser

    a = build_parser().parse_args([*verb, "--store", "/s"])
    assert a.store in ("/s", ["/s"])  # dashboard: --store is repeatable
    assert build_parser().parse_args(verb).store in ("runs", None)  # dashboard: None = runs/


@pytest.mark.parametrize("verb", [["run", "e.yaml"], ["show", "R"], ["import", "x.csv"],
                                  ["calibrate"], ["doctor"]])
def test_out_still_names_the_store_where_it_did(verb):
    from harness.cli import build_parser

    assert build_parser().parse_args([*verb, "--out", "/old"]).store == "/old"


def test_report_out_is_the_report_folder_and_store_the_store():
    from harness.cli import build_parser

    a = build_parser().parse_args(["report", "R", "--out", "/reports/x", "--store", "/s"])
    assert (a.out, a.store) == ("/reports/x", "/s")
    with pytest.raises(SystemExit):  # compare never had --out: no alias there
        build_parser().parse_args(["compare", "A", "B", "--out", "/s"])


def test_list_shows_the_newest_runs_of_the_store(tmp_path, cpu_softmax_run):
    s = tmp_path / ("a-store-path-long-enough-to-be-wider-than-the-runs-table-" * 2)  # no wrap
    src, stdout = cpu_softmax_run
    shutil.copytree(src, s / src.name)
    run = only_run(s)
    listed = harness("list", "--store", str(s), check=True).stdout
    assert run.name in listed and "newest 1 of 1" in listed and "softmax" in listed
    assert "run stored at" in stdout
    assert "runs in" not in harness("list", "--store", str(tmp_path / "none"), check=True).stdout


@pytest.mark.slow
def test_skipped_cases_are_one_line_per_implementation(cpu_flash_run):
    """flash.yaml on a CPU: the 3 SDPA peers skip all 4 smoke cases each -> 3 lines, not 12;
    each case keeps its own reason in the store."""
    run, stdout = cpu_flash_run
    lines = [ln for ln in stdout.splitlines() if ln.startswith("skipped ")]
    assert [ln.split(":")[0] for ln in lines] == ["skipped sdpa_flash", "skipped sdpa_efficient",
                                                 "skipped sdpa_cudnn"], lines
    assert all(": 4 of 4 cases: needs a CUDA device" in ln for ln in lines), lines
    cases = store.load_cases(run)
    skipped = cases[cases.status == "skipped"]
    assert len(skipped) == 12 and skipped.error.str.startswith("needs a CUDA device").all()


def test_list_shows_ops_and_experiments():
    p = harness("list", check=True)
    assert "softmax" in p.stdout and "scale2" in p.stdout and "experiments/softmax.yaml" in p.stdout
