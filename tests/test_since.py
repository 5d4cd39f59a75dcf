"""Pairing a run with its previous comparable run, and the since-last-run block.

Synthetic runs are written with the store's functions (tests/run_factory.py); the end-to-end
test runs the real CLI on the CPU with the harness self-test op.
"""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from html import escape
from pathlib import Path

import numpy as np
import pytest
from cli_inproc import run_cli
from rich.console import Console
from run_factory import CPU_ENV, GPU_ENV, case_id, ncu_rows, write_run

from harness import store

from harness.present import show
from harness.analysis import pairing
from harness.analysis.pairing import Against
from harness.analysis.since import (print_since, since_data, since_html, since_json,
                                    since_lines, since_markdown)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "runs"
H200 = "20261122T021915Z-softmax-6059"
ONE = {"torch/1024": 1.0, "triton/1024": 0.5}


# -- pairing ---------------------------------------------------------------------------------------

def test_pairing_picks_the_latest_earlier_comparable_run(tmp_path):
    older = write_run(tmp_path, minutes=0, medians=ONE)
    write_run(tmp_path, minutes=10, medians=ONE, name="other-experiment")
    write_run(tmp_path, minutes=20, medians=ONE, env={**GPU_ENV, "gpu_name": "NVIDIA B200"})
    write_run(tmp_path, minutes=30, medians=ONE, env={**GPU_ENV, "triton": "3.5.0"})
    write_run(tmp_path, minutes=40, medians=ONE, env={**GPU_ENV, "driver": "570.1"})
    picked = write_run(tmp_path, minutes=50, medians=ONE, status="partial")  # with results
    write_run(tmp_path, minutes=60, medians={"torch/77": 1.0})  # no case in common
    write_run(tmp_path, minutes=70, medians=ONE, status="partial", timed=False)
    write_run(tmp_path, minutes=80, medians=ONE, status="interrupted")
    this = write_run(tmp_path, minutes=90, medians={**ONE, "torch/2048": 2.0})
    write_run(tmp_path, minutes=100, medians=ONE)  # newer: never the "before"
    a = pairing.find_previous(this)
    assert (a.run_id, a.how, Path(a.path)) == (picked.name, "auto", picked.resolve())
    assert a.why == ("the latest earlier run of synthetic on NVIDIA H200 (same driver, torch, "
                     "triton); 2 cases in common")
    # recorded in the manifest; an explicit choice or `none` made at start is kept
    assert pairing.record(this) == a
    assert store.load_manifest(this)["against"] == {
        "run_id": picked.name, "how": "auto", "why": a.why, "path": str(picked.resolve())}
    store.update_manifest(this, against=pairing.request(older.name, tmp_path).as_dict())
    kept = pairing.record(this)
    assert (kept.run_id, kept.how, kept.why) == (older.name, "explicit", f"--against {older.name}")
    store.update_manifest(this, against=pairing.request("none", tmp_path).as_dict())
    assert pairing.record(this) == Against(None, "none", "--against none")
    assert pairing.request("auto", tmp_path) is None and pairing.request(None, tmp_path) is None


def test_no_comparable_run_is_one_line_saying_why(tmp_path):
    write_run(tmp_path, minutes=0, medians=ONE, env={**GPU_ENV, "gpu_name": "NVIDIA B200"})
    write_run(tmp_path, minutes=1, medians={"torch/77": 1.0})
    write_run(tmp_path, minutes=2, medians=ONE, status="interrupted")
    write_run(tmp_path, minutes=3, medians=ONE, name="flash-attention-fwd")
    this = write_run(tmp_path, minutes=10, medians=ONE)
    a = pairing.record(this)
    assert a.run_id is None and a.how == "auto"
    assert a.why == (f"no earlier run of synthetic on NVIDIA H200 in {tmp_path}/ (3 earlier runs "
                     f"of synthetic: 1 interrupted, 1 on another GPU, driver or software, or timed "
                     f"by another method, 1 with no case in common)")
    s = since_data(this)
    assert s.message == f"since: {a.why}" and since_lines(s) == [s.message]
    assert since_markdown(s) == f"> since: {a.why}\n"
    alone = write_run(tmp_path / "fresh", minutes=0, medians=ONE, name="flash-attention-fwd")
    assert pairing.find_previous(alone).why == \
        f"no earlier run of flash-attention-fwd on NVIDIA H200 in {tmp_path / 'fresh'}/"


def test_a_run_made_before_pairing_has_no_block(tmp_path):
    run = write_run(tmp_path, minutes=0, medians=ONE)
    assert since_data(run) is None and show.to_json(run)["since"] is None


# -- the block -------------------------------------------------------------------------------------

SHAPES = [256, 1024, 4096]


def medians(seed: int, slower: str | None = None) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    return {f"{i}/{n}": n / 1000 * (1 + rng.normal(0, 0.004)) * (1.10 if f"{i}/{n}" == slower
                                                                 else 1.0)
            for i in ("torch", "triton", "torch_compile", "liger") for n in SHAPES}


def provenance(block: int, regs: int, spills: int, code: str) -> dict[str, dict]:
    out = {}
    for i in ("torch", "triton", "torch_compile", "liger"):
        for n in SHAPES:
            out[case_id(i, n)] = {"code_hash": f"{i}-{code if i == 'triton' else 'same'}"}
    cid = case_id("triton", 1024)  # as the worker records them (harness.tuning.provenance)
    out[cid].update(config=json.dumps({"fwd": {"BLOCK": block, "num_warps": 4}}),
                    compiled=json.dumps([{"kernel": "softmax_kernel", "registers": regs,
                                          "spills": spills, "shared_bytes": 0, "num_warps": 4,
                                          "launches": 1}]))
    return out


def before_after(root: Path, *, aa_runs: int, env: dict = GPU_ENV) -> tuple[Path, Path]:
    """`aa_runs` A/A runs (GPU runs stored before the time pass used several processes: no
    per-case spread, the A/A floor judges them), then `before`, then `after` where triton
    N=1024 is 10 % slower with another config, more registers and spills, and changed code."""
    for k in range(aa_runs):
        write_run(root, minutes=k, medians=medians(k), env=env, seed=k,
                  extra=provenance(64, 32, 0, "v1"))
    before = write_run(root, minutes=30, medians=medians(30), env=env, seed=30,
                       extra=provenance(64, 32, 0, "v1"))
    after = write_run(root, minutes=40, medians=medians(40, slower="triton/1024"), seed=40,
                      env={**env, "git_sha": "bd53cde64d58"}, spec_hash="spec-a",
                      extra=provenance(128, 40, 2, "v2"))
    pairing.record(after)
    return before, after


def test_block_on_two_runs_with_one_case_10pct_slower(tmp_path):
    before, after = before_after(tmp_path, aa_runs=22)
    s = since_data(after)
    assert s.against.run_id == before.name and s.against.how == "auto"
    # learned on this GPU: 22 A/A pairs + the unchanged cases (same code_hash) of this pair,
    # enough (>= 200 cases of the non-peer impls) for a learned floor to go below the 7 %
    # default; torch_compile's 69 case pairs keep the peers' default (below it only from 200)
    assert re.fullmatch(r"floor \d\.\d% from 23 A/A pairs \(204 cases\); 15% for library and "
                        r"torch.compile impls", s.floor), s.floor
    assert s.n_pairs == 12 and s.counts.get("slower") == 1 and len(s.changes) == 1
    ch = s.changes[0]
    assert ch.key == "triton M=64 N=1024 fp16" and ch.mark == "slower"
    assert re.fullmatch(r"1\.1\dx slower \(significant, p<0\.001, CI 1\.\d\d–1\.\d\d\)", ch.text)
    assert ch.evidence == ["config BLOCK 64 → 128", "regs 32 → 40", "spills 0 → 2",
                           "code changed"]
    assert ch.line == f"{ch.key}: {ch.text}; config BLOCK 64 → 128; regs 32 → 40; " \
                      "spills 0 → 2; code changed"
    triton = next(i for i in s.impls if i.impl == "triton")
    assert triton.n == 3 and triton.geo_ratio == pytest.approx(1 / 1.1 ** (1 / 3), rel=0.01)
    assert triton.counts["slower"] == 1 and "faster" not in triton.counts
    assert "git c896ab45 → bd53cde6" in s.notes

    lines = since_lines(s)
    assert lines[0] == f"since {before.name} (auto): {s.against.why}"
    assert lines[-2:] == [f"1 significant change (noise threshold: {s.floor}):", f"  {ch.line}"]
    md = since_markdown(s)
    assert md.startswith(f"## Since `{before.name}` (auto)\n")
    marks = ", ".join(f"{v} {k}" for k, v in triton.counts.items())
    assert f"| `triton` | 3 | 0.97x | {marks} |" in md
    assert f"- triton M=64 N=1024 fp16: **{ch.text}**; config BLOCK 64 → 128;" in md
    html = since_html(s)
    assert html.startswith(f"<h2>Since <code>{before.name}</code> (auto)</h2>")
    assert f"<strong>{escape(ch.text)}</strong>" in html and "p&lt;0.001" in html
    out = io.StringIO()
    print_since(s, Console(file=out, width=300, color_system=None))
    assert f"triton M=64 N=1024 fp16: {ch.text}; config BLOCK 64 → 128" in out.getvalue()
    js = since_json(s)
    assert js["changes"][0]["evidence"] == ch.evidence and js["lines"] == lines
    json.dumps(js)  # plain JSON types only


def test_cpu_runs_are_never_judged_whatever_the_floor(tmp_path):
    """Interpreter wall-clock says nothing about GPU speed: a 10 % CPU change, with or without
    A/A runs to learn a floor from, is never faster or slower."""
    _, after = before_after(tmp_path, aa_runs=22, env=CPU_ENV)
    s = since_data(after)
    assert s.floor == "CPU: not judged"
    assert not s.changes and s.counts == {"unjudged": 12}
    assert since_lines(s)[-1] == ("no change beyond noise in 12 pairs (12 unjudged; noise "
                                  "threshold: CPU: not judged)")
    triton = next(i for i in s.impls if i.impl == "triton")
    assert triton.counts == {"unjudged": 3}


def test_compiled_and_config_records_as_the_worker_writes_them():
    from harness.analysis.since import compiled_diff, config_diff

    k = {"kernel": "attn_fwd", "registers": 186, "spills": 0, "shared_bytes": 98304,
         "num_warps": 8, "num_stages": 3, "launches": 1, "constexprs": {"BLOCK_N": 64}}
    k2 = {**k, "registers": 168, "num_stages": 2, "constexprs": {"BLOCK_N": 128}}
    assert compiled_diff(json.dumps([k]), json.dumps([k2])) == ["regs 186 → 168", "stages 3 → 2"]
    assert compiled_diff("[]", json.dumps([k2])) is None  # the interpreter compiles nothing
    assert compiled_diff(None, json.dumps([k2])) is None
    two = [k2, {**k2, "kernel": "attn_bwd", "spills": 4}]
    assert compiled_diff(json.dumps([k, {**k, "kernel": "attn_bwd"}]), json.dumps(two)) == [
        "attn_fwd regs 186 → 168", "attn_fwd stages 3 → 2", "attn_bwd regs 186 → 168",
        "attn_bwd spills 0 → 4", "attn_bwd stages 3 → 2"]
    assert compiled_diff(json.dumps([k]), json.dumps(two))[0] == "compiled kernels 1 → 2"
    a = json.dumps({"fwd": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}})
    b = json.dumps({"fwd": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2}})
    assert config_diff(a, b) == "config BLOCK_N 64 → 128, num_stages 3 → 2"
    c = json.dumps({"fwd": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}})
    assert config_diff(a, c) == ("config (BLOCK_M, BLOCK_N, num_warps, num_stages) "
                                 "(128, 64, 8, 3) → (64, 32, 4, 2)")
    two = json.dumps({"attention.dkdv": {"BLOCK": 64}, "attention.dq": {"BLOCK": 32}})
    two2 = json.dumps({"attention.dkdv": {"BLOCK": 64}, "attention.dq": {"BLOCK": 64}})
    assert config_diff(two, two2) == "config dq.BLOCK 32 → 64"
    assert config_diff(a, a) is None and config_diff(a, None) is None


def test_evidence_from_ncu_metrics_and_the_cap(tmp_path):
    cid = case_id("triton", 1024)
    base = ncu_rows(cid, registers_per_thread=168, achieved_occupancy_pct=12.0, block_size=128,
                    dram_throughput_pct=40.0, stall_long_scoreboard=5.0,
                    stall_math_pipe_throttle=1.0)
    cand = ncu_rows(cid, registers_per_thread=128, achieved_occupancy_pct=19.0, block_size=256,
                    dram_throughput_pct=55.0, stall_long_scoreboard=1.0,
                    stall_math_pipe_throttle=3.0)
    meds = {f"{i}/{n}": n / 1000 for i in ("torch", "triton") for n in (256, 1024, 4096)}
    before = write_run(tmp_path, minutes=0, medians=meds, metrics=base)
    faster = {k: v / (1.5 if k == "triton/1024" else 1.2) for k, v in meds.items()}
    after = write_run(tmp_path, minutes=5, medians=faster, seed=3, metrics=cand)
    pairing.record(after)
    s = since_data(after, limit=2)
    assert len(s.changes) == 2 and s.n_more == 4
    assert s.changes[0].key == "triton M=64 N=1024 fp16"
    assert s.changes[0].text.startswith("1.50x faster (significant, p<0.001, CI 1.")
    assert s.changes[0].evidence == [
        "block 128 → 256", "regs 168 → 128", "occupancy 12% → 19%", "DRAM 40% → 55%",
        "top stall long_scoreboard → math_pipe_throttle"]
    assert since_lines(s)[-1] == "  … and 4 more"
    assert "- … and 4 more" in since_markdown(s)


def test_explicit_pair_across_machines_is_compared_loudly(tmp_path):
    other = write_run(tmp_path / "b200", minutes=0, medians=ONE,
                      env={**GPU_ENV, "gpu_name": "NVIDIA B200"})
    this = write_run(tmp_path, minutes=5, medians=ONE, seed=2)
    store.update_manifest(this, against=pairing.request(str(other), tmp_path).as_dict())
    s = since_data(this)
    assert s.against.how == "explicit" and not s.message
    assert s.notes[0].startswith("INCOMPARABLE RUNS, compared anyway: GPU differs")
    shutil.rmtree(other)
    gone = since_data(this)
    assert gone.message == (f"since {other.name} (explicit): not compared: run {other.name} "
                            f"(this run's previous run) is no longer in {tmp_path}/")


def test_report_puts_the_block_at_the_top(tmp_path, h200_and_a_later_copy):
    from harness.present.report import Report

    before, after = h200_and_a_later_copy("20261123T000000Z-softmax-synthetic")
    s = store.load_samples(after)
    slow = s.case_id == "triton.M=8192.N=8192.float16"
    s.loc[slow, "ms"] *= 1.1
    store.write_table(after, "samples", s)
    pairing.record(after)
    rep = Report(after, store_arg=str(tmp_path))
    md = rep.markdown()
    top = md.index(f"## Since `{H200}` (auto)")
    assert top < md.index("## Headline")
    assert "- triton M=8192 N=8192 fp16: **1.10x slower (significant, p<0.001, CI" in md
    html = rep.html({})
    assert html.index('<section class="since">') < html.index("<h2>Headline</h2>")


# -- end to end: run --against, show ---------------------------------------------------------------

ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
       "HARNESS_OPS": "harness_test_ops", "COLUMNS": "200"}


def harness(*args):
    return run_cli(args, env=ENV)  # in this process (tests/cli_inproc.py)


@pytest.mark.slow
def test_run_records_against_auto_explicit_and_none(tmp_path):
    exp = tmp_path / "e.yaml"
    exp.write_text("name: selftest\nop: scale2\nbaseline: torch\ncandidates: [zeros]\n"
                   "sweep: {N: [64, 1000]}\ndtypes: [float32]\n"
                   "timing: {rep_ms: 20, min_samples: 3}\n")
    out = tmp_path / "runs"
    p = harness("run", str(exp), "--out", str(out))
    assert p.returncode == 0, p.stderr
    first = store.list_runs(out)[0]["path"]
    m = store.load_manifest(first)
    assert m["against"] == {"run_id": None, "how": "auto", "path": None,
                            "why": f"no earlier run of selftest on the CPU in {out}/"}
    assert f"since: no earlier run of selftest on the CPU in {out}/" in p.stdout

    p = harness("run", str(exp), "--out", str(out), "--against", "none")
    assert p.returncode == 0, p.stderr
    second = store.list_runs(out)[1]["path"]
    assert store.load_manifest(second)["against"]["how"] == "none"
    assert "since: --against none" in p.stdout

    p = harness("run", str(exp), "--out", str(out), "--against", Path(first).name)
    assert p.returncode == 0, p.stderr
    third = store.list_runs(out)[2]["path"]
    rec = store.load_manifest(third)["against"]
    assert (rec["run_id"], rec["how"]) == (Path(first).name, "explicit")
    assert f"since {Path(first).name} (explicit): --against {Path(first).name}" in p.stdout
    assert "per implementation, geo-mean of before/now median time" in p.stdout
    # auto now picks the latest earlier comparable run: the third
    assert pairing.find_previous(third).run_id == Path(second).name

    shown = harness("show", Path(third).name, "--out", str(out))
    assert f"since {Path(first).name} (explicit)" in shown.stdout
    js = json.loads(harness("show", third, "--format", "json").stdout)
    assert js["since"]["against"]["run_id"] == Path(first).name
    assert js["since"]["title"] == f"since {Path(first).name} (explicit)"

    bad = harness("run", str(exp), "--out", str(out), "--against", "no-such-run")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "--against: run 'no-such-run' not found" in bad.stderr
    assert "valid: a run id or run directory, auto, none" in bad.stderr
    assert len(store.list_runs(out)) == 3  # nothing written


def test_resume_of_a_complete_run_pairs_it_again(tmp_path):
    from harness.execute import runner

    older = write_run(tmp_path, minutes=0, medians=ONE)
    this = write_run(tmp_path, minutes=5, medians=ONE, seed=2)
    quiet = Console(file=io.StringIO())
    runner.resume(this.name, out_root=str(tmp_path), console=quiet, against="auto")
    assert store.load_manifest(this)["against"]["run_id"] == older.name
    runner.resume(this.name, out_root=str(tmp_path), console=quiet, against="none")
    assert store.load_manifest(this)["against"]["how"] == "none"


def test_the_block_on_a_real_h200_aa_pair_is_quiet():
    """The second run of a real H200 A/A pair (tests/fixtures/runs/README.md): nothing beyond
    noise. sdpa_cudnn D=64 N=16384 bf16 moved 1.12x with its SM clock; under the peers' 15%
    default it is "same" (a library's kernel; test_compare checks the clock rule on this pair
    at 7%), and triton_flash's one ambiguous case names its clock move."""
    from harness.analysis.since import since_data, since_lines

    root = Path(__file__).parent / "fixtures" / "runs"
    lines = since_lines(since_data(root / "20261123T111637Z-flash-attention-fwd-093a"))
    assert lines[0].startswith("since 20261123T111534Z-flash-attention-fwd-c462 (auto)")
    assert not any("the SM clock explains" in line for line in lines)
    assert "  sdpa_cudnn: 1.01x over 40 cases: 40 same" in lines
    assert lines[-1].startswith("no change beyond noise in 80 pairs (79 same, 1 ambiguous;")
    assert lines[-1].endswith("15% for library and torch.compile impls)")
