"""analysis.compare and the `compare` verb, on synthetic samples whose answer is known.

Synthetic runs are built here in tmp_path (clearly labelled `synthetic`); the real H200 run
fixture under tests/fixtures/runs/ is used where real data matters.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness import cli, store
from harness.analysis.compare import (Comparison, TimeDiff, compare_runs, compare_samples,
                                      env_problems)
from harness.present.compare_cli import parse_pct, to_json, to_markdown
from harness.errors import HarnessError

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
H200_RUN = FIXTURES / "20261122T021915Z-softmax-6059"
H200_ENV = {"device": "cuda", "gpu_name": "NVIDIA H200", "driver": "580.159.04",
            "sm_clock_max_mhz": 1980.0, "mem_clock_max_mhz": 3201.0, "app_sm_clock_mhz": 1980.0}


def noisy(median: float, n: int = 300, rel_sd: float = 0.005, seed: int = 1) -> np.ndarray:
    return median * (1 + np.random.default_rng(seed).normal(0, rel_sd, n))


def make_run(root: Path, run_id: str, cases: dict[str, dict], env: dict | None = None,
             metrics: list[dict] | None = None) -> Path:
    """A synthetic softmax run: cases = {impl: {"ms": samples, "correct": bool, "N": int}}."""
    run_dir = root / run_id
    (run_dir / "raw").mkdir(parents=True)
    env = dict(H200_ENV if env is None else env)
    store.write_manifest(run_dir, {
        "run_id": run_id, "schema_version": store.SCHEMA_VERSION, "device": env.get("device"),
        "env": env, "status": "complete", "command": ["python", "-m", "harness", "run", "x"],
        "experiment": {"name": "synthetic", "op": "softmax", "baseline": "torch",
                       "candidates": ["triton"]}})
    crows, rrows, srows = [], [], []
    for impl, c in cases.items():
        params = {"M": 64, "N": c.get("N", 1024)}
        cid = f"{impl}.M=64.N={params['N']}.float16"
        correct = c.get("correct", True)
        crows.append({"case_id": cid, "op": "softmax", "impl": impl,
                      "role": "baseline" if impl == "torch" else "candidate",
                      "params": json.dumps(params), "dtype": "float16",
                      "status": "ok" if correct else "failed", "error": None})
        ms = np.asarray(c.get("ms", []), dtype=float)
        rrows.append({"case_id": cid, "correct": correct,
                      "median_ms": float(np.median(ms)) if len(ms) else None,
                      "sm_clock_timed_mhz": c.get("clock"), "code_hash": c.get("code")})
        srows += [{"case_id": cid, "i": i, "ms": float(v)} for i, v in enumerate(ms)]
    store.write_table(run_dir, "cases", pd.DataFrame(crows))
    store.write_table(run_dir, "results", pd.DataFrame(rrows))
    store.write_table(run_dir, "samples", pd.DataFrame(srows, columns=store.SAMPLE_COLUMNS))
    if metrics:
        store.write_table(run_dir, "metrics", pd.DataFrame(metrics))
    return run_dir


def ncu(case_id: str, **values) -> list[dict]:
    rows = []
    for name, v in values.items():
        unit = v if isinstance(v, str) else ""
        rows.append({"case_id": case_id, "source": "ncu", "kernel": "k", "name": name,
                     "value": 1.0 if isinstance(v, str) else float(v), "unit": unit})
    return rows


# -- compare_samples: the decision rule ----------------------------------------------------------

def test_identical_samples_are_same():
    x = noisy(1.0)
    d = compare_samples(x, x.copy())
    assert isinstance(d, TimeDiff)
    assert d.mark == "same", d
    assert d.ratio == pytest.approx(1.0)
    assert d.ci_low <= 1.0 <= d.ci_high
    assert d.text.startswith("same (within 2%")


def test_ten_percent_faster_and_slower():
    base, cand = noisy(1.0, seed=1), noisy(1 / 1.1, seed=2)
    d = compare_samples(base, cand)
    assert d.mark == "faster", d
    assert d.ratio == pytest.approx(1.1, rel=0.01)
    assert d.ci_low > 1.02 and d.p_value < 0.001
    assert d.text == "1.10x faster (significant, p<0.001)"
    back = compare_samples(cand, base)
    assert back.mark == "slower", back
    assert back.text == "1.10x slower (significant, p<0.001)"


def test_heavy_overlap_is_ambiguous():
    base = noisy(1.0, n=40, rel_sd=0.3, seed=3)
    cand = noisy(0.97, n=40, rel_sd=0.3, seed=4)
    d = compare_samples(base, cand)
    assert d.mark == "ambiguous", d
    assert "95% CI" in d.text
    assert d.ci_low < 1 < d.ci_high


def test_small_significant_shift_inside_noise_band_is_same():
    # a real 0.5 % shift: significant with many samples, but within the 2 % noise band
    base, cand = noisy(1.0, n=3000, rel_sd=0.002, seed=5), noisy(1 / 1.005, n=3000,
                                                                rel_sd=0.002, seed=6)
    d = compare_samples(base, cand)
    assert d.p_value < 0.01
    assert d.mark == "same", d


def test_deterministic_for_a_seed_and_few_samples_never_decide():
    base, cand = noisy(1.0, n=50, rel_sd=0.05, seed=7), noisy(0.95, n=50, rel_sd=0.05, seed=8)
    assert compare_samples(base, cand, seed=3) == compare_samples(base, cand, seed=3)
    d = compare_samples([1.0, 1.0, 1.0], [0.5, 0.5, 0.5])
    assert d.mark == "ambiguous" and "too few samples" in d.text


# -- env ------------------------------------------------------------------------------------------

def test_env_problems_name_what_differs():
    assert env_problems(H200_ENV, dict(H200_ENV)) == []
    p = env_problems(H200_ENV, {**H200_ENV, "driver": "570.1", "sm_clock_max_mhz": 1755.0})
    assert any("driver" in s and "570.1" in s for s in p)
    assert any("max SM clock" in s for s in p)
    assert len(p) == 2
    assert env_problems(H200_ENV, {"device": "cpu"}) == ["device kind differs: 'cuda' vs 'cpu'"]


def test_incomparable_runs_refused_unless_allowed(tmp_path):
    a = make_run(tmp_path, "base", {"torch": {"ms": noisy(1.0)}})
    b = make_run(tmp_path, "cand", {"torch": {"ms": noisy(1.0)}},
                 env={**H200_ENV, "gpu_name": "NVIDIA H100 80GB HBM3"})
    with pytest.raises(HarnessError, match=r"not comparable: GPU differs: 'NVIDIA H200' vs "
                                           r"'NVIDIA H100 80GB HBM3'.*--allow-incomparable"):
        compare_runs(a, b)
    c = compare_runs(a, b, allow_incomparable=True)
    assert c.problems and c.headline.startswith("INCOMPARABLE RUNS")
    assert "INCOMPARABLE" in to_markdown(c) and to_json(c)["incomparable"] is True


# -- compare_runs ---------------------------------------------------------------------------------

def test_compare_runs_pairs_marks_and_metric_deltas(tmp_path):
    base = make_run(tmp_path, "base", {
        "torch": {"ms": noisy(1.0, seed=1)}, "triton": {"ms": noisy(0.5, seed=2)}},
        metrics=ncu("triton.M=64.N=1024.float16", registers_per_thread=168,
                    achieved_occupancy_pct=12.0, dram_throughput_pct=40.0,
                    stall_long_scoreboard=5.0, stall_math_pipe_throttle=1.0))
    cand = make_run(tmp_path, "cand", {
        "torch": {"ms": noisy(1.0, seed=3)}, "triton": {"ms": noisy(0.5 / 1.18, seed=4)}},
        metrics=ncu("triton.M=64.N=1024.float16", registers_per_thread=128,
                    achieved_occupancy_pct=19.0, dram_throughput_pct=40.5,
                    stall_long_scoreboard=1.0, stall_math_pipe_throttle=3.0))
    c = compare_runs(base, cand)
    assert isinstance(c, Comparison) and not c.problems
    t = c.time.set_index("key")
    assert list(c.time.columns[:15]) == ["key", "op", "impl", "params", "dtype", "base_case_id",
                                         "cand_case_id", "base_ms", "cand_ms", "ratio",
                                         "ci_low", "ci_high", "p_value", "mark", "text"]
    assert t.loc["torch M=64 N=1024 fp16", "mark"] == "same"
    assert t.loc["triton M=64 N=1024 fp16", "mark"] == "faster"
    assert t.loc["triton M=64 N=1024 fp16", "text"] == \
        "1.18x faster (significant, p<0.001, CI 1.18–1.18)"
    m = c.metrics.set_index("name")
    assert set(m.index) == {"registers_per_thread", "achieved_occupancy_pct", "top_stall"}
    assert (m.loc["registers_per_thread", "base"], m.loc["registers_per_thread", "cand"]) == \
        (168.0, 128.0)
    assert m.loc["top_stall", "cand"] == "math_pipe_throttle"
    line = [s for s in c.pair_lines() if s.startswith("triton")][0]
    assert line == ("triton M=64 N=1024 fp16: 1.18x faster (significant, p<0.001, "
                    "CI 1.18–1.18); "
                    "regs 168 → 128; occupancy 12% → 19%; "
                    "top stall long_scoreboard → math_pipe_throttle")


def test_failed_correctness_never_faster_and_missing_samples(tmp_path):
    base = make_run(tmp_path, "base", {"torch": {"ms": noisy(1.0)}, "triton": {"ms": noisy(1)}})
    cand = make_run(tmp_path, "cand", {"torch": {"ms": []},
                                       "triton": {"ms": noisy(0.5), "correct": False}})
    t = compare_runs(base, cand).time.set_index("impl")
    assert t.loc["triton", "mark"] == "ambiguous"
    assert t.loc["triton", "text"].startswith("not credited: the candidate case failed "
                                              "correctness (2.00x faster")
    assert t.loc["torch", "mark"] == "missing"
    assert "no samples in the candidate run" in t.loc["torch", "text"]


def test_a_change_the_sm_clock_explains_is_not_credited_and_the_clock_is_named(tmp_path):
    """Real H200 A/A pair (same code, same config): triton_flash 1.11x and sdpa_cudnn 1.08x
    apart with the clock under load 1815 vs 1950 MHz. Such a change is not faster/slower; one
    larger than the clock can explain still is, and the clock is named as evidence. Where the
    code changed, the change may have moved the clock: the mark stands."""
    def case(ms, clock, code="c0"):
        return {"ms": ms, "clock": clock, "code": code}

    base = make_run(tmp_path, "base", {
        "torch": case(noisy(1.0, seed=1), 1950.0), "triton": case(noisy(1.0, seed=2), 1815.0),
        "cudnn": case(noisy(1.0, seed=5), 1815.0), "flash": case(noisy(1.0, seed=7), 1950.0),
        "edited": case(noisy(1.0, seed=9), 1950.0)})
    cand = make_run(tmp_path, "cand", {
        "torch": case(noisy(1.0, seed=3), 1950.0),
        "triton": case(noisy(1 / 1.09, seed=4), 1950.0),  # clock x1.074: explained
        "cudnn": case(noisy(1 / 1.25, seed=6), 1950.0),   # beyond the clock: faster
        "flash": case(noisy(1 / 1.10, seed=8), 1815.0),   # the clock fell, yet faster
        "edited": case(noisy(1.09, seed=10), 1815.0, code="c1")})  # new code, slower clock
    t = compare_runs(base, cand, noise=0.03).time.set_index("impl")
    assert t.loc["torch", "mark"] == "same"
    assert t.loc["triton", "mark"] == "ambiguous"
    assert t.loc["triton", "text"].startswith("not credited: 1.09x faster (significant")
    assert t.loc["triton", "text"].endswith(
        "but the SM clock under load moved 1815 → 1950 MHz, which alone explains up to 1.07x")
    assert "SM clock 1815 → 1950 MHz" in t.loc["triton", "evidence"]
    assert t.loc["cudnn", "mark"] == "faster"
    assert "SM clock 1815 → 1950 MHz" in t.loc["cudnn", "evidence"]
    assert t.loc["flash", "mark"] == "faster"
    assert t.loc["edited", "mark"] == "slower"
    assert t.loc["edited", "evidence"] == ["SM clock 1950 → 1815 MHz", "code changed"]
    assert not any(e.startswith("SM clock") for e in t.loc["torch", "evidence"])


def test_real_h200_aa_pair_the_clock_explains_its_one_would_be_mark():
    """Two runs of unchanged code on one H200 (tests/fixtures/runs/README.md): no case is
    faster or slower; sdpa_cudnn D=64 N=16384 bf16 (1.12x slower, p<0.001) is not credited,
    because its SM clock under load fell 1935 -> 1718 MHz. Without the clock it is marked."""
    a = FIXTURES / "20261123T111534Z-flash-attention-fwd-c462"
    b = FIXTURES / "20261123T111637Z-flash-attention-fwd-093a"
    t = compare_runs(a, b, noise=0.07).time.set_index("key")
    assert set(t.mark) <= {"same", "ambiguous"} and (t.mark == "same").sum() == 77
    key = "sdpa_cudnn B=1 D=64 H=16 N=16384 causal=false mode=fwd bf16"
    assert t.loc[key, "text"] == (
        "not credited: 1.12x slower (significant, p<0.001, CI 1.11–1.14), but the SM clock "
        "under load moved 1935 → 1718 MHz, which alone explains up to 1.13x")
    assert "SM clock 1935 → 1718 MHz" in t.loc[key, "evidence"]
    samples = pd.read_parquet(a / "samples.parquet"), pd.read_parquet(b / "samples.parquet")
    xa, xb = (s[s.case_id == t.loc[key, "base_case_id"]].ms for s in samples)
    assert compare_samples(xa, xb, noise=0.07).mark == "slower"  # the clock is what saves it


def test_no_common_case_is_a_user_error(tmp_path):
    a = make_run(tmp_path, "base", {"torch": {"ms": noisy(1.0), "N": 10}})
    b = make_run(tmp_path, "cand", {"torch": {"ms": noisy(1.0), "N": 20}})
    with pytest.raises(HarnessError, match="no case in common"):
        compare_runs(a, b)


def test_real_run_against_itself_is_never_faster_or_slower():
    c = compare_runs(H200_RUN, H200_RUN)
    assert len(c.time) == 18
    assert set(c.time.mark) <= {"same", "ambiguous"}
    assert (c.time.ratio == 1.0).all() and not len(c.metrics)


# -- the verb -------------------------------------------------------------------------------------

def test_parse_pct():
    assert parse_pct("5%") == pytest.approx(0.05)
    assert parse_pct("2.5") == pytest.approx(0.025)
    with pytest.raises(HarnessError, match="percentage"):
        parse_pct("five")


def test_cli_fail_on_regression_exit_codes(tmp_path, capsys):
    base = make_run(tmp_path, "base", {"torch": {"ms": noisy(1.0)}, "triton": {"ms": noisy(1)}})
    slow = make_run(tmp_path, "slow", {"torch": {"ms": noisy(1.0, seed=9)},
                                       "triton": {"ms": noisy(1.1, seed=10)}})
    argv = ["compare", "base", "slow", "--store", str(tmp_path), "--fail-on-regression"]
    assert cli.main(argv + ["5%"]) == 1
    out = capsys.readouterr().out
    assert ("regression: triton M=64 N=1024 fp16: 1.10x slower (significant, p<0.001, "
            "CI 1.10–1.10)") in out
    assert "1 pair(s) significantly slower by more than 5%" in out
    assert cli.main(argv + ["15%"]) == 0  # 10 % slower is within a 15 % budget
    assert cli.main(["compare", "slow", "base", "--store", str(tmp_path),
                     "--fail-on-regression", "5%"]) == 0  # the other way it is faster
    capsys.readouterr()
    assert cli.main(["compare", str(base), str(slow), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {r["impl"]: r["mark"] for r in data["time"]} == {"torch": "same", "triton": "slower"}


def test_cli_refuses_incomparable_with_one_line(tmp_path, capsys):
    make_run(tmp_path, "base", {"torch": {"ms": noisy(1.0)}})
    make_run(tmp_path, "cand", {"torch": {"ms": noisy(1.0)}}, env={**H200_ENV, "driver": "1"})
    assert cli.main(["compare", "base", "cand", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "driver differs: '580.159.04' vs '1'" in err
    assert cli.main(["compare", "base", "cand", "--store", str(tmp_path),
                     "--allow-incomparable", "--format", "md"]) == 0
    assert "> **INCOMPARABLE RUNS, compared anyway" in capsys.readouterr().out
