"""The noise rule: a pair is faster/slower only beyond max(between-run floor, its own spread).

Synthetic runs (tests/run_factory.py) whose answer is known: an A/A pair with a 3 % run-level
offset (below the default GPU floor) is never marked; a 10 % shift is, with its p and CI; the
floor is learned from the A/A runs already in the store (below the default only from 200 case
pairs); `--fail-on-regression` follows the same rule.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from run_factory import CPU_ENV, GPU_ENV, case_id, samples, write_run

from harness import cli, store
from harness.analysis import noise
from harness.analysis.compare import compare_runs, compare_samples

SHAPES = [256, 512, 1024, 2048, 4096, 8192]
IMPLS = ["torch", "triton"]


def medians(scale: float = 1.0, jitter: float = 0.0, seed: int = 0) -> dict[str, float]:
    """12 cases; each case's median * scale * (1 + N(0, jitter)) (run-to-run drift)."""
    rng = np.random.default_rng(seed)
    return {f"{impl}/{n}": n / 1000 * scale * (1 + rng.normal(0, jitter))
            for impl in IMPLS for n in SHAPES}


def aa_store(root, *, runs: int = 3, jitter: float = 0.01, env=None, first_minute: int = 0):
    """`runs` A/A runs (same spec hash, same clean commit) with per-case drift `jitter`."""
    return [write_run(root, minutes=first_minute + 10 * k, medians=medians(jitter=jitter, seed=k),
                      env=env, seed=k) for k in range(runs)]


# -- the rule on two runs -------------------------------------------------------------------------

def test_aa_pair_with_a_3pct_run_offset_is_never_marked(tmp_path):
    """Tight samples: the MWU p is tiny for every case, but 3 % is inside the 7 % GPU floor."""
    a = write_run(tmp_path, minutes=0, medians=medians(), seed=1)
    b = write_run(tmp_path, minutes=5, medians=medians(scale=1.03), seed=2, spec_hash="other")
    c = compare_runs(a, b)
    assert (c.time.p_value < 0.001).all()  # what MWU alone would have cried wolf on
    assert set(c.time.mark) == {"same"}, c.time[["key", "mark", "text"]]
    assert c.floor.source == "default" and c.floor.value == 0.07
    assert c.floor.text.startswith("default floor 7% (no A/A runs in")
    assert any(n.startswith("noise threshold: default floor 7%") for n in c.notes)
    assert (c.time.threshold >= 0.07).all()
    assert c.time.text.iloc[0].startswith("same (within 7%")


def test_a_10pct_shift_is_marked_with_p_and_ci(tmp_path):
    a = write_run(tmp_path, minutes=0, medians=medians(), seed=1)
    slow = {k: v * (1.10 if k == "triton/1024" else 1.0) for k, v in medians().items()}
    b = write_run(tmp_path, minutes=5, medians=slow, seed=2, spec_hash="other")
    t = compare_runs(a, b).time.set_index("cand_case_id")
    row = t.loc[case_id("triton", 1024)]
    assert row.mark == "slower"
    assert row.p_value < 0.001 and row.ci_high < 1 / 1.07
    assert row.text.startswith("1.10x slower (significant, p<0.001, CI 1.")
    lo, hi = (float(x) for x in row.text.split("CI ")[1].rstrip(")").split("–"))
    assert lo <= 1.10 <= hi and lo > 1.05
    assert set(t.drop(index=case_id("triton", 1024)).mark) == {"same"}


def test_a_pair_own_spread_raises_its_threshold():
    """20 noisy samples a side: a 10 % shift is within what that spread can resolve."""
    base, cand = samples(1.0, n=20, rel_sd=0.2, seed=1), samples(1.1, n=20, rel_sd=0.2, seed=2)
    band = noise.threshold(0.05, base, cand)
    assert band == pytest.approx(noise.pair_mde(base, cand)) and band > 0.10
    assert compare_samples(base, cand, noise=band).mark not in ("faster", "slower")
    tight = samples(1.0, n=500, seed=3)
    assert noise.threshold(0.05, tight, tight) == 0.05


def test_band_is_symmetric_in_log_space():
    base = samples(1.0, n=400, rel_sd=0.002, seed=1)
    assert compare_samples(base, base / 1.045, noise=0.05).mark == "same"
    assert compare_samples(base, base * 1.045, noise=0.05).mark == "same"
    assert compare_samples(base, base * 1.06, noise=0.05).mark == "slower"
    assert compare_samples(base, base / 1.06, noise=0.05).mark == "faster"


# -- the floor learned from A/A runs --------------------------------------------------------------

def test_floor_learned_from_stored_aa_runs(tmp_path):
    runs = aa_store(tmp_path, runs=18, jitter=0.005)
    f = noise.learn_floor([tmp_path], GPU_ENV)
    assert f.source == "learned" and (f.n_pairs, f.n_cases) == (17, 204)
    ratios = np.concatenate([noise.aa_log_ratios(a, b) for a, b in zip(runs, runs[1:])])
    assert f.value == pytest.approx(np.expm1(np.quantile(ratios, 0.99)))
    assert 0.005 < f.value < 0.03
    assert f.text == (f"floor {f.value * 100:.1f}% from 17 A/A pairs (204 cases); 15% for "
                      "library and torch.compile impls")
    # a 3 % shift: inside the 7 % default, beyond the learned floor -> now a real change
    a = write_run(tmp_path, minutes=100, medians=medians(), seed=7, spec_hash="exp-b")
    b = write_run(tmp_path, minutes=105, medians=medians(scale=1.03), seed=8, spec_hash="exp-c")
    c = compare_runs(a, b)
    assert c.floor == f
    assert set(c.time.mark) == {"slower"}
    assert any(n.startswith(f"noise threshold: {f.text}") for n in c.notes)


def test_a_few_quiet_aa_pairs_raise_the_floor_but_never_lower_it(tmp_path):
    """~50 ratios put the 99th percentile at about their maximum, which lands under the true
    percentile about half the time: below 200 case pairs the default stays (H200: a floor
    learned on long flash kernels marked a 5 % A/A gap of a 36 us softmax kernel)."""
    aa_store(tmp_path, runs=6, jitter=0.005)  # 5 pairs, 60 cases, learned ~1.5 %
    f = noise.learn_floor([tmp_path], GPU_ENV)
    assert (f.source, f.value, f.n_pairs, f.n_cases) == ("default", 0.07, 5, 60)
    assert re.fullmatch(r"default floor 7% \(learned \d\.\d% from 5 A/A pairs with 60 cases in "
                        r".*; lowers the default from 200 cases\); 15% for library and "
                        r"torch.compile impls", f.text)
    noisy = tmp_path / "noisy"
    aa_store(noisy, runs=6, jitter=0.04)  # a noisier machine: the floor goes up at once
    g = noise.learn_floor([noisy], GPU_ENV)
    assert g.source == "learned" and g.value > 0.07


def test_a_pair_without_a_case_of_the_same_code_calibrates_nothing(tmp_path):
    def extra(h):
        return {case_id(i, n): {"code_hash": h, "config": None} for i in IMPLS for n in SHAPES}

    runs = [write_run(tmp_path, minutes=k, medians=medians(seed=k), seed=k, extra=extra(f"h{k}"))
            for k in range(3)]  # every impl edited between runs: 2 candidate pairs, 0 cases
    assert len(noise.aa_run_pairs([tmp_path], GPU_ENV)) == 2
    f = noise.learn_floor([tmp_path], GPU_ENV)
    assert (f.source, f.n_pairs) == ("default", 0) and "no A/A runs" in f.text
    assert len(runs) == 3


def test_what_is_not_an_aa_pair(tmp_path):
    aa_store(tmp_path, runs=2, jitter=0.01)  # one A/A pair: too few to trust
    f = noise.learn_floor([tmp_path], GPU_ENV)
    assert f.source == "default" and f.n_pairs == 1
    assert f.text.endswith("1 A/A pair with 12 cases in " + str(tmp_path) + "/; needs 2 pairs "
                           "and 50 cases); 15% for library and torch.compile impls")
    # a dirty tree, another GPU, another spec, an interrupted run: none of them pair up
    write_run(tmp_path, minutes=30, medians=medians(), env={**GPU_ENV, "git_dirty": True})
    write_run(tmp_path, minutes=31, medians=medians(), env={**GPU_ENV, "gpu_name": "NVIDIA B200"})
    write_run(tmp_path, minutes=32, medians=medians(), spec_hash="spec-b")
    write_run(tmp_path, minutes=33, medians=medians(), status="interrupted")
    assert len(noise.aa_run_pairs([tmp_path], GPU_ENV)) == 1
    # another commit only pairs with itself
    other = {**GPU_ENV, "git_sha": "bd53cde64d58"}
    write_run(tmp_path, minutes=40, medians=medians(), env=other)
    write_run(tmp_path, minutes=41, medians=medians(), env=other)
    assert len(noise.aa_run_pairs([tmp_path], GPU_ENV)) == 2


def test_code_hash_decides_per_case_when_results_carry_it(tmp_path):
    """Runs at different commits still pair on the cases whose code (and config) is the same."""
    def extra(triton_hash, cfg):
        return {case_id(i, n): {"code_hash": triton_hash if i == "triton" else "h-torch",
                                "config": json.dumps(cfg) if i == "triton" else None}
                for i in IMPLS for n in SHAPES}

    a = write_run(tmp_path, minutes=0, medians=medians(), extra=extra("h1", {"BLOCK": 64}))
    b = write_run(tmp_path, minutes=1, medians=medians(scale=1.5), seed=1,
                  env={**GPU_ENV, "git_sha": "another", "git_dirty": True},
                  extra=extra("h2", {"BLOCK": 64}))
    c = write_run(tmp_path, minutes=2, medians=medians(scale=1.5), seed=2,
                  extra=extra("h2", {"BLOCK": 128}))
    assert noise.aa_run_pairs([tmp_path], GPU_ENV) == [(a, b), (b, c)]
    assert len(noise.aa_log_ratios(a, b)) == 6  # torch only: triton's code changed
    assert len(noise.aa_log_ratios(b, c)) == 6  # torch only: triton's config changed


def test_outliers_are_left_out_and_cpu_has_its_own_default(tmp_path):
    runs = aa_store(tmp_path, runs=18, jitter=0.005)
    res = store.load_results(runs[2])
    res.loc[0, "median_ms"] *= 5  # a recompilation-like 5x jump between "identical" runs
    store.write_table(runs[2], "results", res)
    f = noise.learn_floor([tmp_path], GPU_ENV)
    assert f.n_outliers == 2 and f.n_cases == 202 and f.value < 0.05  # both pairs of runs[2]
    assert f.text == (f"floor {f.value * 100:.1f}% from 17 A/A pairs (202 cases, 2 outliers "
                      "left out); 15% for library and torch.compile impls")
    cpu = noise.learn_floor([tmp_path], CPU_ENV)
    assert (cpu.source, cpu.value) == ("default", 0.25)


# -- the verb -------------------------------------------------------------------------------------

def test_fail_on_regression_uses_the_same_rule(tmp_path, capsys):
    write_run(tmp_path, minutes=0, medians=medians(), seed=1, name="aa")
    write_run(tmp_path, minutes=5, medians=medians(scale=1.03), seed=2, name="aa",
              spec_hash="other")
    base, cand = (r["run_id"] for r in store.list_runs(tmp_path))
    argv = ["compare", base, cand, "--store", str(tmp_path), "--fail-on-regression", "1%"]
    assert cli.main(argv) == 0  # 3 % slower everywhere, but within the 7 % floor: no regression
    out = capsys.readouterr().out
    assert "12 pairs: 12 same" in out and "default floor 7%" in out
    assert cli.main(argv + ["--noise-floor", "2%"]) == 1  # a 2 % floor: 3 % is beyond it
    out = capsys.readouterr().out
    assert "12 pair(s) significantly slower by more than 1%" in out
    assert "noise floor 2% (given)" in out
    assert cli.main(argv + ["--noise-floor", "lots"]) == 2
    assert "--noise-floor: expected a percentage" in capsys.readouterr().err
    assert cli.main(["compare", base, cand, "--store", str(tmp_path), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["noise_floor"]["source"] == "default" and data["noise_floor"]["value"] == 0.07
    assert all(r["threshold"] >= 0.07 for r in data["time"])


def test_a_noisier_implementation_gets_its_own_floor_from_its_aa_cases(tmp_path):
    """H200, flash.yaml twice: sdpa_cudnn moved up to 10-15 % between runs of the same code on a
    few shapes while naive moved < 1 %; one machine-wide floor either cries wolf on the library
    kernel or hides real changes of the quiet ones."""
    def mixed(seed):
        rng = np.random.default_rng(seed)
        return {f"{impl}/{n}": n / 1000 * (1 + rng.normal(0, 0.06 if impl == "triton" else 0.003))
                for impl in IMPLS for n in [2 ** k for k in range(6, 12)]}

    for k in range(7):  # 6 A/A pairs: 36 case pairs per implementation
        write_run(tmp_path, minutes=10 * k, medians=mixed(k), seed=k)
    f = noise.learn_floor([tmp_path], GPU_ENV)
    floors = dict(f.per_impl)
    assert set(floors) == {"torch", "triton"} and floors["triton"] > 0.10
    assert floors["torch"] == 0.07  # quiet, but below the default only from 200 case pairs
    assert f.for_impl("triton") == floors["triton"] and f.for_impl("other") == f.value
    # the machine's floor is the noisy one's (it dominates the pooled tail): only torch's differs
    assert f.value > 0.10 and f.text.endswith("; own floor (its own A/A cases): torch 7.0%")
    assert f.as_dict()["per_impl"] == floors
    # the next pair: a 9 % triton move is inside its own noise, a 9 % torch move is not
    a = write_run(tmp_path, minutes=200, medians=medians(), seed=70, spec_hash="exp-b")
    b = write_run(tmp_path, minutes=205, medians=medians(scale=1.09), seed=71, spec_hash="exp-c")
    t = compare_runs(a, b).time
    assert set(t[t.impl == "triton"].mark) <= {"same", "ambiguous"}
    assert set(t[t.impl == "torch"].mark) == {"slower"}


def test_library_and_compile_peers_get_the_wider_default_until_a_floor_is_learned(tmp_path):
    """A fresh store: torch.compile (Inductor autotunes per process) moving 12 % between two
    runs of unchanged code is "same" under the peers' 15 % default, while our Triton kernel's
    real 10 % change is still marked at 7 %; A/A runs of our kernels alone teach the machine's
    floor and leave the peers' default alone."""
    meds = {**medians(), **{f"torch_compile/{n}": n / 1000 for n in SHAPES}}
    moved = {k: v * (1.12 if k.startswith("torch_compile/") else
                     1.10 if k == "triton/1024" else 1.0) for k, v in meds.items()}
    a = write_run(tmp_path, minutes=0, medians=meds, seed=1)
    b = write_run(tmp_path, minutes=5, medians=moved, seed=2, spec_hash="other")
    c = compare_runs(a, b)
    t = c.time.set_index("cand_case_id")
    assert set(t[t.impl == "torch_compile"].mark) == {"same"}, t[["mark", "text"]]
    assert (t[t.impl == "torch_compile"].threshold >= 0.15).all()
    assert t.loc[case_id("triton", 1024)].mark == "slower"
    assert c.floor.for_impl("sdpa_cudnn", "library") == 0.15
    assert c.floor.for_impl("triton", "triton") == 0.07
    assert "15% for library and torch.compile impls" in c.floor.text
    aa = aa_store(tmp_path / "aa", runs=6, jitter=0.03)  # a learned floor (above the default)
    f = noise.floor_for(*aa)
    assert f.source == "learned" and f.peer == 0.15 and f.peer_source == "default"
    assert f.for_impl("torch_compile", "compile") == 0.15
    assert f.for_impl("other", "triton") == f.value


def test_the_peers_floor_is_learned_apart_from_ours(tmp_path):
    """H200: one A/A pair of flash.yaml and one of softmax.yaml (92 case pairs) pooled learned
    11.2 % for every implementation from torch_compile's 1.12x moves: the flash pair's compare
    marked torch_compile "1.12x faster", and our kernels' threshold had grown by half. Learned
    apart, our quiet kernels keep a tight floor and torch_compile the peers' own."""
    def meds(k: int) -> dict[str, float]:
        rng = np.random.default_rng(k)
        m = {f"{impl}/{n}": n / 1000 * (1 + rng.normal(0, 0.012)) for impl in IMPLS
             for n in SHAPES}
        m.update({f"torch_compile/{n}": n / 1000 * (1.12 if k % 2 and n in (1024, 2048) else 1)
                  for n in SHAPES})
        return m

    for k in range(6):  # 5 A/A pairs: 60 case pairs of ours, 30 of torch_compile's
        write_run(tmp_path, minutes=10 * k, medians=meds(k), seed=k)
    f = noise.learn_floor([tmp_path], GPU_ENV)
    assert f.n_pairs == 5 and f.n_cases == 60 and f.peer_cases == 30
    assert f.value == 0.07  # ours: quiet, and below the default only from 200 case pairs
    assert f.peer == 0.15 and f.peer_source == "default"  # 30 < 50 peer case pairs
    # pooled (the old rule) the floor would have been torch_compile's tail
    pooled = pd.concat(noise.aa_ratios(a, b) for a, b in noise.aa_run_pairs([tmp_path], GPU_ENV))
    assert np.expm1(np.quantile(pooled, noise.QUANTILE)) > 0.10
    # the next pair of the same code: torch_compile's 12 % is same, triton's real 10 % is marked
    a = write_run(tmp_path, minutes=200, medians=meds(0), seed=70, spec_hash="exp-b")
    moved = {k: v * (1.12 if k.startswith("torch_compile/") else
                     1.10 if k == "triton/1024" else 1.0) for k, v in meds(0).items()}
    b = write_run(tmp_path, minutes=205, medians=moved, seed=71, spec_hash="exp-c")
    t = compare_runs(a, b).time.set_index("cand_case_id")
    assert set(t[t.impl == "torch_compile"].mark) == {"same"}, t[["mark", "text"]]
    assert t.loc[case_id("triton", 1024)].mark == "slower"
    # enough peer case pairs: their own floor, learned (here above their default)
    more = tmp_path / "more"
    for k in range(11):
        rng = np.random.default_rng(100 + k)
        write_run(more, minutes=10 * k, seed=k, medians={
            **medians(seed=k, jitter=0.01),
            **{f"torch_compile/{n}": n / 1000 * (1 + rng.normal(0, 0.05)) for n in SHAPES}})
    g = noise.learn_floor([more], GPU_ENV)
    assert g.peer_cases == 60 and g.peer_source == "learned" and g.peer > 0.15
    assert g.for_impl("torch_compile", "compile") in (g.peer, dict(g.per_impl).get(
        "torch_compile"))
    assert "for library and torch.compile impls (from their 60 A/A cases)" in g.text
