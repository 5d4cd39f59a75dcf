"""Run-to-run comparisons judged by each case's own between-process spread (analysis.spread).

Synthetic runs (tests/run_factory.py, labelled `synthetic`) whose time pass "ran" in two worker
processes, each with its own offset; one real CPU run for what the time pass stores.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from run_factory import GPU_ENV, write_run

from harness import store
from harness.analysis import spread
from harness.analysis.compare import compare_runs

SHAPES = [2 ** k for k in range(8, 14)]
IMPLS = ("torch", "triton")


def medians(scale: dict[str, float] | None = None) -> dict[str, float]:
    scale = scale or {}
    return {f"{i}/{n}": n / 1000 * scale.get(i, 1.0) for i in IMPLS for n in SHAPES}


def test_a_5pct_change_is_marked_by_the_cases_own_spread(tmp_path):
    """Processes 0.3 % apart: a 5 % slower Triton kernel is marked on every case, the torch
    control on none, and no 7 % floor stands in the way."""
    a = write_run(tmp_path, minutes=0, medians=medians(), processes=2, proc_sd=0.003, seed=1,
                  n=100)
    b = write_run(tmp_path, minutes=5, medians=medians({"triton": 1.05}), processes=2,
                  proc_sd=0.003, seed=2, spec_hash="other", n=100)
    c = compare_runs(a, b)
    t = c.time
    assert set(t.method) == {"measured"}
    assert set(t[t.impl == "triton"].mark) == {"slower"}, t[["key", "mark", "text"]]
    assert set(t[t.impl == "torch"].mark) <= {"same", "ambiguous"}
    assert (t.threshold < 0.05).all() and (t.mde < 0.05).all()
    assert c.floor.text.startswith("each case's own between-process spread (2+2 processes")
    assert c.notes[0].startswith("noise threshold: each case's own between-process spread")
    assert c.floor.as_dict()["measured"] == 12


def test_aa_pairs_with_process_noise_are_never_marked(tmp_path):
    """Two runs of unchanged code whose processes wander by 1 % (three times the spread above):
    shifts of a few percent between runs, none marked."""
    many = {f"{i}/{n}": n / 1000 for i in IMPLS for n in range(1000, 31000, 1000)}
    for seed in (1, 3):
        a = write_run(tmp_path / str(seed), minutes=0, medians=many, processes=2,
                      proc_sd=0.01, seed=seed, n=60)
        b = write_run(tmp_path / str(seed), minutes=5, medians=many, processes=2,
                      proc_sd=0.01, seed=seed + 1, n=60)
        t = compare_runs(a, b).time
        assert len(t) == 60 and not t.mark.isin(["faster", "slower"]).any(), \
            t[t.mark.isin(["faster", "slower"])][["key", "text"]]
        moved = np.abs(np.log(t.ratio.astype(float)))
        assert moved.max() > 0.01  # the runs did move: 1 % process noise, not a quiet pair


def test_the_band_holds_its_level_on_simulated_aa_cases():
    """The rule's own calibration: 2+2 process medians drawn with one spread, no change; the
    share of cases beyond their band stays near ALPHA (0.1 %); a 5 % change with half that
    spread (0.5 %) is beyond the band of nearly every case."""
    rng = np.random.default_rng(7)

    def beyond(sd: float, change: float, n: int) -> float:
        ev = [spread.Evidence(rng.normal(0, sd, 2), rng.normal(np.log1p(change), sd, 2))
              for _ in range(n)]
        pri = spread.priors([(i, "k", i / n, e) for i, e in enumerate(ev)])
        return sum(abs(e.xb.mean() - e.xa.mean()) > np.log1p(spread.band(e, pri[i])[0])
                   for i, e in enumerate(ev)) / n

    assert beyond(0.01, 0.0, 2000) < 0.004
    assert beyond(0.005, 0.05, 300) > 0.95


def test_a_case_with_a_wide_spread_of_its_own_is_not_marked(tmp_path):
    """One Triton case's processes disagree by 8 %: its 10 % change is within its own noise,
    while another Triton case's 5 % change, with quiet processes, is marked."""
    noisy, quiet = "triton/1024", "triton/4096"
    sd = {k: (0.08 if k == noisy else 0.003) for k in medians()}
    a = write_run(tmp_path, minutes=0, medians=medians(), processes=2, proc_sd=sd, seed=11,
                  n=100)
    moved = {k: v * (1.10 if k == noisy else 1.05 if k == quiet else 1.0)
             for k, v in medians().items()}
    b = write_run(tmp_path, minutes=5, medians=moved, processes=2, proc_sd=sd, seed=12, n=100)
    rows = compare_runs(a, b).time.set_index("cand_case_id")
    assert rows.loc["triton.M=64.N=1024.float16", "mark"] not in ("faster", "slower")
    assert rows.loc["triton.M=64.N=1024.float16", "threshold"] > 0.10
    assert rows.loc["triton.M=64.N=4096.float16", "mark"] == "slower"
    assert len(rows) == 12


def test_processes_that_agree_by_chance_get_their_peers_band():
    """Two processes a side give a variance with 2 degrees of freedom: a case whose processes
    happen to agree exactly is judged with its peers' spread, not with none."""
    lucky = spread.Evidence(np.log([1.0, 1.0]), np.log([1.03, 1.03]))
    alone, _, df = spread.band(lucky, None)
    assert alone == 0.0 and df == 2
    peers = spread.prior([spread.Evidence(np.log([1.0, 1.02]), np.log([1.0, 0.98]))] * 10)
    band, sd, df = spread.band(lucky, peers)
    assert df == 2 + spread.PRIOR_DF and band > 0.03 and sd > 0
    # a case noisier than its peers keeps its own spread
    wild = spread.Evidence(np.log([1.0, 1.2]), np.log([1.0, 0.8]))
    assert spread.band(wild, peers)[1] == pytest.approx(np.sqrt(wild.s2))
    assert spread.log_medians("[1.0]") is None and spread.log_medians(None) is None
    assert spread.log_medians(json.dumps([1.0, 2.0])) == pytest.approx(np.log([1.0, 2.0]))


def test_runs_without_per_process_medians_keep_the_aa_floor(tmp_path):
    """A run stored before the time pass used several processes, against a new one: the A/A
    floor (here its 7 % default) judges the pairs, and says so."""
    old = write_run(tmp_path, minutes=0, medians=medians(), seed=1, n=60)
    new = write_run(tmp_path, minutes=5, medians=medians({"triton": 1.05}), processes=2,
                    proc_sd=0.003, seed=2, spec_hash="other", n=60)
    c = compare_runs(old, new)
    assert set(c.time.method) == {"floor"}
    assert set(c.time.mark) == {"same"}  # 5 % is inside the old 7 % default
    assert c.floor.source == "default" and c.floor.value == 0.07


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """A real CPU run of the harness self-test op whose YAML asks for two time processes (on
    the CPU the default is one: its timings are never judged)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    tmp = tmp_path_factory.mktemp("procs")
    exp = tmp / "e.yaml"
    exp.write_text("name: procs\nop: scale2\nbaseline: torch\nsweep: {N: [64, 1000]}\n"
                   "dtypes: [float32]\ntiming: {processes: 2, rep_ms: 20, min_samples: 3}\n")
    env = {**os.environ, "HARNESS_OPS": "harness_test_ops",
           "PYTHONPATH": f"{root}{os.pathsep}{root / 'tests'}"}
    p = subprocess.run([sys.executable, "-m", "harness", "run", str(exp), "--store",
                        str(tmp / "runs")], cwd=root, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    (run,) = [d for d in (tmp / "runs").iterdir() if (d / "manifest.json").exists()]
    return run


@pytest.mark.slow
def test_a_real_run_stores_each_process_and_compare_reads_it(two_process_run, tmp_path):
    """The time pass ran in two worker processes: each case keeps both medians and its samples
    say which process took them. Relabelled as GPU runs (CPU timings are never judged),
    compare judges the pairs by them."""
    run = two_process_run
    assert (run / "parts" / "time_p2.jsonl").exists() and store.time_processes(run) == 2
    res = store.load_results(run)
    assert len(res) == 2 and all(len(json.loads(v)) == 2 for v in res.process_medians_ms)
    s = store.load_samples(run)
    assert set(s.process) == {0, 1}
    one = res.iloc[0]
    assert len(s[s.case_id == one.case_id]) == int(one.n_samples)
    assert float(one.median_ms) == pytest.approx(
        float(np.median(s[s.case_id == one.case_id].ms)))
    pair = []
    for name in ("a", "b"):
        d = tmp_path / f"2026112{len(pair)}T000000Z-{name}"
        shutil.copytree(run, d)
        m = store.load_manifest(d)
        store.write_manifest(d, {**m, "run_id": d.name, "device": "cuda",
                                 "env": {**GPU_ENV, **{k: v for k, v in m["env"].items()
                                                       if k in ("torch", "triton")}}})
        pair.append(d)
    t = compare_runs(*pair).time
    assert len(t) == 2 and set(t.method) == {"measured"}
    assert set(t.mark) <= {"same", "ambiguous"}


def test_two_processes_on_a_gpu_one_on_the_cpu_unless_the_yaml_says(tmp_path):
    cpu = write_run(tmp_path, minutes=0, medians=medians(), env={**GPU_ENV, "device": "cpu"})
    gpu = write_run(tmp_path, minutes=1, medians=medians())
    assert (store.time_processes(cpu), store.time_processes(gpu)) == (1, 2)
    m = store.load_manifest(cpu)
    store.write_manifest(cpu, {**m, "experiment": {**m["experiment"],
                                                   "timing": {"processes": 3}}})
    assert store.time_processes(cpu) == 3
    m = store.load_manifest(gpu)
    store.write_manifest(gpu, {**m, "experiment": {**m["experiment"],
                                                   "timing": {"processes": 1}}})
    assert store.time_processes(gpu) == 1  # given up explicitly: the A/A floor judges it


def test_each_process_takes_its_share_of_the_budget_in_its_own_order():
    from harness.execute.executors.process import measure_parts, rotated
    from harness.execute.timing import share

    one = dict(warmup_ms=25.0, rep_ms=100.0, min_samples=10, max_samples=5000,
               max_rel_err=0.01)
    two = share(2, **one)
    assert (two["warmup_ms"], two["rep_ms"], two["min_samples"], two["max_samples"]) == \
        (12.5, 50.0, 5, 2500)
    assert two["max_rel_err"] == pytest.approx(0.01 * 2 ** 0.5)  # pooled: 1 % as before
    assert two["batch_ms"] == 10.0  # two half batches: the samples one process took alone
    assert share(3, **{**one, "min_samples": 3})["min_samples"] == 5  # a median of 5 at least
    ids = list("abcdef")
    assert rotated(ids, 2, 2) == list("cbafed")  # half-way round, reversed
    assert rotated(ids, 3, 3) == list("efabcd")
    assert measure_parts(3) == ("check", "time", "time_p2", "time_p3")
    assert [store.repeat_index(p) for p in ("time", None, "time_p2", "time_p3")] == [0, 0, 1, 2]


def test_every_run_times_a_case_on_the_same_inputs(tmp_path):
    """The time pass's inputs are seeded by the case, not the run (the check pass's are the
    run's): two runs of unchanged code then differ only by what differs between processes."""
    import torch

    from harness.execute.worker import Worker
    from harness.experiment import spec as spec_mod
    from harness.store.results import cases_frame

    exp = spec_mod.from_dict({"name": "seeds", "op": "softmax", "baseline": "torch",
                              "sweep": {"M": [4], "N": [64]}, "dtypes": ["float32"]})
    cases = spec_mod.expand(exp)
    made = []
    for seed in (1, 2):
        run = store.create_run(tmp_path / str(seed), "seeds", {
            "experiment": exp.model_dump(mode="json"), "device": "cpu", "seed": seed,
            "status": "running", "passes": {}, "env": {"device": "cpu"}})
        store.write_table(run, "cases", cases_frame(cases))
        w = Worker(run, "cpu")
        case_id, impl_name, params, dtype = w.cases[0]
        fn, _ = w._prepare(w.op.get_impl(impl_name), params, dtype, case_id)
        made.append(fn())
    assert torch.equal(made[0], made[1])
    assert not torch.equal(made[0], torch.zeros_like(made[0]))
