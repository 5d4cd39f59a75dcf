"""Executors on the CPU: sharding with fake GPUs, the watchdog, SIGKILLed runs, --gpus/--ray.

The per-GPU executor is exercised with fake device indices: its workers run on the CPU (the
pinning env var is harmless there), which tests everything but the GPU itself.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_inproc import run_cli
from rich.console import Console

from harness import store

from harness.experiment import spec
from harness.errors import HarnessError
from harness.execute.executors import make_executor
from harness.execute.executors.gpus import GpuExecutor
from harness.execute.executors.local import LocalExecutor
from harness.execute.executors.schedule import (case_timeout_s, estimate_s, longest_first,
                                                parse_gpus, shard)

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
       "HARNESS_OPS": "harness_test_ops", "COLUMNS": "200"}
H200 = {"gpu_name": "NVIDIA H200"}


def harness(*args):
    return run_cli(args, env=ENV)  # in this process (tests/cli_inproc.py)


# -- schedule (pure) -----------------------------------------------------------------------------

def test_parse_gpus_all_count_and_indices():
    present = [H200] * 4
    assert parse_gpus("all", present) == [0, 1, 2, 3]
    assert parse_gpus("2", present) == [0, 1]
    assert parse_gpus("0,2", present) == [0, 2]


@pytest.mark.parametrize("req,present,msg", [
    ("2", [], "no NVIDIA GPU on this host"),
    ("all", [], "no NVIDIA GPU on this host"),
    ("3", [H200, H200], "this host has 2 GPUs"),
    ("0,5", [H200, H200], "no GPU 5 on this host"),
    ("0,0", [H200, H200], "repeated"),
    ("x", [H200], "expected 'all', a count or indices"),
    ("0,1", [H200, {"gpu_name": "NVIDIA H100"}], "different models"),
])
def test_parse_gpus_refuses_with_one_line(req, present, msg):
    with pytest.raises(HarnessError) as e:
        parse_gpus(req, present)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_longest_first_assignment_balances_and_keeps_order_for_ties():
    cost = {"a": 1, "b": 10, "c": 3, "d": 3, "e": 9, "f": 2}
    ids = list(cost)
    assert longest_first(ids, cost) == ["b", "e", "c", "d", "f", "a"]
    shards = shard(ids, cost, 2)
    assert sorted(sum(shards, [])) == sorted(ids)           # every case exactly once
    assert shards == [["b", "d", "a"], ["e", "c", "f"]]       # loads 14 and 14
    for s in shards:                                         # each shard longest first
        assert [cost[c] for c in s] == sorted((cost[c] for c in s), reverse=True)
    assert shard(ids, cost, 10)[6:] == [[], [], [], []]     # more GPUs than cases
    # one long case does not become the tail: it starts first, alone on its GPU
    cost = {"long": 100, **{f"s{i}": 1 for i in range(10)}}
    s = shard(list(cost), cost, 2)
    assert s[0] == ["long"] and len(s[1]) == 10


def test_a_shapes_cases_run_back_to_back_so_its_reference_is_computed_once():
    """Costs from a previous run's times interleave shapes (every impl of the slowest shape is
    not slower than every impl of the next): grouped, each shape's cases stay together, the
    shapes longest first by their summed cost."""
    cost = {"naive.s1": 12.0, "flash.s1": 4.0, "naive.s2": 6.0, "flash.s2": 2.0,
            "naive.s3": 3.0, "flash.s3": 5.0}
    group = {c: c.split(".")[1] for c in cost}
    assert longest_first(list(cost), cost)[:3] == ["naive.s1", "naive.s2", "flash.s3"]
    assert longest_first(list(cost), cost, group) == [
        "naive.s1", "flash.s1", "naive.s2", "flash.s2", "flash.s3", "naive.s3"]
    assert shard(list(cost), cost, 1, group) == [longest_first(list(cost), cost, group)]
    # many shapes per GPU: whole shapes go to one GPU, still back to back there
    cost = {f"{impl}.s{i}": float(i + (impl == "naive")) for i in range(1, 9)
            for impl in ("naive", "flash")}
    group = {c: c.split(".")[1] for c in cost}
    parts = shard(list(cost), cost, 2, group)
    assert sorted(sum(parts, [])) == sorted(cost)
    for part in parts:
        shapes = [group[c] for c in part]
        assert all(shapes[i] == shapes[i + 1] for i in range(0, len(shapes), 2))
    # a config grid (one shape, many impls) is still spread over the GPUs
    grid = {f"v{i}.s1": 1.0 for i in range(8)}
    parts = shard(list(grid), grid, 2, {c: "s1" for c in grid})
    assert [len(p) for p in parts] == [4, 4]


def _families_sweep(n_fam=8, sizes=(1, 2, 4, 8, 16), impls=("naive", "flash")):
    """flash.yaml's structure: families (D, causal, dtype) of shapes (N) of implementations;
    a causal family's estimate half a full one's."""
    cost, shape, family = {}, {}, {}
    for f in range(n_fam):
        for n in sizes:
            for impl in impls:
                c = f"{impl}.f{f}.n{n}"
                cost[c] = n * (0.5 if f % 2 else 1.0) * (3.0 if impl == "naive" else 1.0)
                shape[c], family[c] = f"f{f}.n{n}", f"f{f}"
    return cost, shape, family


def test_whole_families_go_to_one_gpu_where_the_deal_stays_even():
    """A family's shapes run the same compiled kernels: dealt whole, each GPU loads only its
    own families' graphs and configs; its shapes are still back to back and longest first."""
    cost, shape, family = _families_sweep()
    parts = shard(list(cost), cost, 2, shape, family)
    assert sorted(sum(parts, [])) == sorted(cost)
    assert [len({family[c] for c in p}) for p in parts] == [4, 4]  # no family on both
    load = [sum(cost[c] for c in p) for p in parts]
    by_shape = shard(list(cost), cost, 2, shape)
    assert max(load) <= 1.05 * max(sum(cost[c] for c in p) for p in by_shape)
    for p in parts:
        assert p == longest_first(p, cost, shape)
    # without families, or with too few of them per GPU, the deal of shapes
    assert shard(list(cost), cost, 2, shape, None) == by_shape
    cost3, shape3, family3 = _families_sweep(n_fam=6)
    assert shard(list(cost3), cost3, 2, shape3, family3) == shard(list(cost3), cost3, 2,
                                                                   shape3)
    assert shard(list(cost), cost, 1, shape, family) == [longest_first(list(cost), cost, shape)]


def test_families_stay_apart_only_while_the_gpus_stay_even():
    """One family far heavier than the rest: dealt whole it would be one GPU's tail, so the
    deal of shapes is kept."""
    cost, shape, family = _families_sweep()
    cost = {c: v * (12.0 if family[c] == "f0" else 1.0) for c, v in cost.items()}
    by_shape = shard(list(cost), cost, 2, shape)
    assert shard(list(cost), cost, 2, shape, family) == by_shape
    assert all(sum(1 for c in p if family[c] == "f0") < 10 for p in by_shape)  # f0 split


def test_a_runs_families_are_its_params_that_are_not_sizes_and_its_dtype(tmp_path, test_ops,
                                                                          monkeypatch):
    """families(run_dir): the cases of one family differ in size params only (Param.size);
    an op without size params has a family per shape (the deal of shapes, as before)."""
    from harness.execute import code_tree
    from harness.execute.executors.gpus import families
    from harness.registry import Param

    run, ids = _run_dir(tmp_path, ["zeros", "torch"], n=(64, 1000))  # scale2's N: no size
    fam, shapes = families(run), store.shapes(run)
    assert set(fam) == set(ids)
    assert all((fam[a] == fam[b]) == (shapes[a] == shapes[b]) for a in ids for b in ids)
    # the same cases with N a size: one family per dtype
    monkeypatch.setattr(code_tree, "op_for", lambda m: SimpleNamespace(
        params=[Param("N", int, size=True)]))
    fam = families(run)
    dtypes = {c: c.rsplit(".", 1)[1] for c in ids}
    assert all((fam[a] == fam[b]) == (dtypes[a] == dtypes[b]) for a in ids for b in ids)
    monkeypatch.setattr(code_tree, "op_for", lambda m: 1 / 0)
    assert families(run) == {}  # an op that cannot be loaded: shapes only


def _timing(**kw):
    return spec.TimingOptions(**kw)


def test_estimate_prefers_previous_times_and_orders_by_size():
    from harness.registry import registry
    op = registry().get_op("softmax")
    t = _timing(warmup_ms=25, rep_ms=200)
    small = estimate_s({"M": 64, "N": 64}, "float16", op, t, "cuda")
    big = estimate_s({"M": 8192, "N": 8192}, "float16", op, t, "cuda")
    assert big > small > 0.2
    assert estimate_s({"M": 64, "N": 64}, "float16", op, t, "cuda", prev_median_ms=1000.0) > 10


def test_watchdog_limit_is_generous_and_overridable():
    assert case_timeout_s(1.0, _timing()) == 120.0          # never kill a slow first compile
    assert case_timeout_s(100.0, _timing()) == 400.0
    assert case_timeout_s(100.0, _timing(case_timeout_s=2.5)) == 2.5
    with pytest.raises(HarnessError):
        spec.from_dict({"name": "x", "op": "softmax", "baseline": "torch",
                        "cases": [{"M": 1, "N": 8}], "timing": {"case_timeout_s": 0}})


def test_make_executor_gpus_on_a_gpu_less_machine_and_both_flags():
    with pytest.raises(HarnessError, match="no NVIDIA GPU"):
        make_executor(gpus="2", device="cuda", present=[])
    with pytest.raises(HarnessError, match="not both"):
        make_executor(gpus="2", ray="local")
    ex = make_executor(gpus="0,2", device="cuda", present=[H200] * 3)
    assert isinstance(ex, GpuExecutor) and ex.gpus == [0, 2]
    d = ex.describe()
    assert d["kind"] == "gpus" and d["gpus"] == [0, 2] and d["gpu_fingerprints"]["2"] == H200


# -- the per-GPU executor with fake devices, real CPU workers -------------------------------------

def _run_dir(tmp_path, impls, n=(64, 1000), extra=""):
    from harness.store.results import cases_frame
    exp = spec.from_dict({
        "name": "selftest", "op": "scale2", "baseline": "torch", "candidates": impls,
        "sweep": {"N": list(n)}, "dtypes": ["float32"],
        "timing": {"rep_ms": 10, "min_samples": 3, **(extra or {})}})
    cases = spec.expand(exp)
    m = {"experiment": exp.model_dump(mode="json"), "device": "cpu", "seed": 1,
         "status": "running", "passes": {}, "env": {"device": "cpu"}}
    run = store.create_run(tmp_path, "selftest", m)
    store.write_table(run, "cases", cases_frame(cases))
    return run, [c.case_id for c in cases]


@pytest.mark.slow
def test_gpus_executor_shards_records_gpu_and_survives_a_killed_and_a_hung_worker(tmp_path,
                                                                                 test_ops):
    from harness.registry import registry
    from harness.store.results import consolidate
    run, ids = _run_dir(tmp_path, ["segfault", "hang"], extra={"case_timeout_s": 3})
    cost = {c: (10.0 if c.startswith(("segfault", "hang")) else 1.0) for c in ids}
    ex = GpuExecutor([0, 1], {0: H200, 1: H200})
    plan = ex.plan(ids, cost)
    assert sorted(plan[0] + plan[1]) == sorted(ids) and plan[0] and plan[1]
    events = []
    limits = {c: 3.0 for c in ids}
    t0 = time.monotonic()
    ex.measure(run, longest_first(ids, cost), cost, limits, "cpu", events.append)
    assert time.monotonic() - t0 < 120
    cases, _, _ = consolidate(run, registry().get_op("scale2"))
    st = dict(zip(cases.case_id, cases.status))
    assert st["torch.N=64.float32"] == st["torch.N=1000.float32"] == "ok"
    assert st["segfault.N=64.float32"] == "error" and st["hang.N=1000.float32"] == "timeout"
    err = dict(zip(cases.case_id, cases.error))["hang.N=64.float32"]
    assert err.startswith("timed out after 3 s (watchdog; timing.case_timeout_s)")
    gpu = dict(zip(cases.case_id, cases.gpu))
    for g, shard_ids in plan.items():  # each case ran on the GPU its shard was given
        assert all(gpu[c] == g for c in shard_ids), (g, shard_ids, gpu)
    parts = sorted(p.name for p in (run / "parts").iterdir())
    assert parts == ["check.gpu0.jsonl", "check.gpu1.jsonl", "time.gpu0.jsonl",
                     "time.gpu1.jsonl"]
    assert all(h for h in cases.host)
    # resume: nothing left to do, nothing redone
    before = {p: (run / "parts" / p).read_text() for p in parts}
    ex.measure(run, ids, cost, limits, "cpu", events.append)
    assert before == {p: (run / "parts" / p).read_text() for p in parts}


@pytest.mark.slow
def test_resume_with_gpus_finishes_only_what_is_missing(tmp_path, test_ops):
    run, ids = _run_dir(tmp_path, ["zeros"])
    store.append_part(run, "check", {"case_id": ids[0], "status": "ok", "correct": True})
    store.append_part(run, "time", {"case_id": ids[0], "status": "ok", "samples": [1.0],
                                    "median_ms": 1.0})
    ex = GpuExecutor([0, 1])
    seen = []
    ex.measure(run, ids, {}, {c: 60.0 for c in ids}, "cpu",
               lambda ev: seen.append(ev["case_id"]) if ev["event"] == "start" else None)
    assert ids[0] not in seen and set(seen) == set(ids[1:])
    assert {r["case_id"] for r in store.read_parts(run, "time")} == set(ids)


# -- through the CLI ----------------------------------------------------------------------------

def _exp(tmp_path, impls, extra=""):
    path = tmp_path / "e.yaml"
    path.write_text(f"name: selftest\nop: scale2\nbaseline: torch\ncandidates: {impls}\n"
                    f"sweep: {{N: [64, 1000]}}\ndtypes: [float32]\n"
                    f"timing: {{rep_ms: 20, min_samples: 3{extra}}}\n")
    return path


@pytest.mark.slow
def test_a_hanging_implementation_times_out_as_its_own_case(tmp_path):
    out = tmp_path / "runs"
    p = harness("run", str(_exp(tmp_path, "[hang]", ", case_timeout_s: 2")), "--store", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    run = next(out.iterdir())
    cases = store.load_cases(run).set_index("case_id")
    assert set(cases.status[cases.index.str.startswith("hang")]) == {"timeout"}
    assert set(cases.status[cases.index.str.startswith("torch")]) == {"ok"}
    assert "timed out after 2 s (watchdog; timing.case_timeout_s)" in \
        cases.error["hang.N=64.float32"]
    m = store.load_manifest(run)
    assert m["status"] == "complete" and m["executor"]["kind"] == "local"
    assert set(m["pass_wall_s"]) >= {"check", "time", "total"}
    assert "wall: check " in p.stdout and "total" in p.stdout
    spans = m["pass_spans_s"]  # when each phase ran, from the run's start, in order
    assert sorted(spans, key=spans.get) == ["check", "time", "finish"], spans
    assert 0 <= spans["check"][0] <= spans["time"][0] <= spans["time"][1] <= spans["finish"][0]
    assert spans["finish"][1] <= m["pass_wall_s"]["total"] + 0.01
    assert re.search(r"timeline \(s\): check \d+\.\d-\d+\.\d · time ", p.stdout), p.stdout
    assert "timeout" in p.stdout


def test_profiler_line_says_what_each_process_spent_besides_its_cases():
    from harness.execute.timeline import profiler_line

    assert profiler_line({}) is None
    assert profiler_line({"ncu": {"per_case_s": {"a": 1.0}}}) is None  # carried: nothing ran
    one = {"ncu": {"to_first_case_s": 0.04, "after_last_s": 0.71, "run_s": 13.0},
           "nsys": {"to_first_case_s": 5.33, "run_s": 12.8}}
    assert profiler_line(one) == ("profiler processes (s from each turn): ncu to its first "
                                  "case 0.0, after its last 0.7 · nsys to its first case 5.3")
    two = {"nsys": {"to_first_case_s": 6.3, "after_last_s": 2.0, "processes": [
        {"gpu": 0, "cases": 160, "run_s": 6.7, "to_first_case_s": 1.5, "after_last_s": 2.0},
        {"gpu": 1, "cases": 120, "run_s": 11.1, "to_first_case_s": 6.3,
         "after_last_s": 1.9}]}}
    assert profiler_line(two) == (
        "profiler processes (s from each turn): nsys@gpu0 (160 cases) to its first case 1.5, "
        "after its last 2.0 · nsys@gpu1 (120 cases) to its first case 6.3, after its last 1.9")
    # a process whose turn came before it had started up says so; one set up before, not
    late = {"ncu": {"to_first_case_s": 5.3, "processes": [
        {"gpu": 0, "cases": 3, "run_s": 11.5, "to_first_case_s": 5.3, "ready_s": 4.96},
        {"gpu": 1, "cases": 4, "run_s": 11.5, "to_first_case_s": 0.0, "ready_s": -9.7}]}}
    assert profiler_line(late) == (
        "profiler processes (s from each turn): ncu@gpu0 (3 cases) set up 5.0 after its turn, "
        "to its first case 5.3 · ncu@gpu1 (4 cases) to its first case 0.0")


def test_show_prints_where_a_real_runs_profiler_processes_spent_their_turn():
    """A committed flash_bwd run (one H100): its nsys process loaded its cases for 11.8 s
    after its turn, before its first case; `show` says so after the timeline."""
    out = harness("show", "20261127T130555Z-flash-attention-bwd-1054", "--store",
                  str(ROOT / "runs" / "examples")).stdout
    lines = out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("timeline (s):"))
    assert lines[at + 1] == ("profiler processes (s from each turn): ncu to its first case "
                             "0.0, after its last 1.9 · nsys to its first case 11.8, after its "
                             "last 3.4")


def test_show_prints_the_profilers_plan_against_when_each_gpu_ended(tmp_path, test_ops):
    run, _ = _run_dir(tmp_path, ["zeros"])
    store.update_manifest(run, pass_spans_s={"ncu@gpu0": [54.4, 67.0], "nsys@gpu0": [66.4, 81.6],
                                             "ncu@gpu1": [61.4, 72.8], "nsys@gpu1": [72.4, 77.3]},
                          profiler_plan={"at_s": 50.31, "gpus": [
                              {"gpu": 0, "busy_s": 3.7, "end_s": 75.44,
                               "cases": {"ncu": 3, "nsys": 160}},
                              {"gpu": 1, "busy_s": 10.3, "end_s": 76.0,
                               "cases": {"ncu": 4, "nsys": 120}}]})
    out = harness("show", run.name, "--store", str(run.parent)).stdout
    assert ("profilers' plan (at 50.3 s): GPU 0 done at ~75.4 s, ended 81.6 · GPU 1 done at "
            "~76.0 s, ended 77.3") in out


def test_timeline_merges_a_phase_added_twice_and_orders_by_start():
    from harness.execute.timeline import Timeline, timeline_line

    tl = Timeline(t0=100.0)
    tl.add("time", 110.0, 120.0)
    tl.add("check", 101.0, 111.54)
    tl.add("time", 108.0, 119.0)  # a second GPU's lane of the same pass
    assert tl.record() == {"check": [1.0, 11.54], "time": [8.0, 20.0]}
    line = "timeline (s): check 1.0-11.5 · time 8.0-20.0"
    assert timeline_line(tl.record()) == line
    assert timeline_line({"time": [8.0, 20.0], "check": [1.0, 11.54]}) == line


@pytest.mark.slow
def test_a_sigkilled_run_shows_as_interrupted_and_resumes(tmp_path):
    out = tmp_path / "runs"
    env = {**ENV, "HARNESS_TEST_SLOW_S": "1.0"}
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run",
                             str(_exp(tmp_path, "[slow]")), "--store", str(out)], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:  # wait for the first record, then kill everything hard
        parts = list(out.glob("*/parts/check*.jsonl"))
        if parts and parts[0].read_text().strip():
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run = next(out.iterdir())
    m = store.load_manifest(run)
    assert m["status"] == "running" and m["driver"]["pid"] == proc.pid
    assert store.effective_status(m) == "interrupted"
    assert [r["status"] for r in store.list_runs(out)] == ["interrupted"]
    js = json.loads(harness("show", str(run), "--format", "json").stdout)
    assert js["status"] == "interrupted"
    p = subprocess.run([sys.executable, "-m", "harness", "run", "--resume", str(run), "--store",
                        str(out)], cwd=ROOT, env={**ENV, "HARNESS_TEST_SLOW_S": "0.01"},
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert store.load_manifest(run)["status"] == "complete"
    assert set(store.load_cases(run).status) == {"ok"}


def test_a_live_run_is_running_and_other_hosts_are_trusted():
    m = {"status": "running", "driver": store.driver_record()}
    assert store.effective_status(m) == "running"
    assert store.effective_status({**m, "driver": {**m["driver"], "host": "elsewhere",
                                                   "pid": 999999999}}) == "running"
    assert store.effective_status({"status": "running"}) == "running"  # old runs: no driver
    recycled = {**m["driver"], "started": "2001-01-01T00:00:00+00:00"}  # pid reused since
    assert store.effective_status({**m, "driver": recycled}) == "interrupted"
    assert store.effective_status({**m, "status": "complete"}) == "complete"


@pytest.mark.parametrize("content", [b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
                                     b"name: caf\xe9\nop: softmax\n"])
def test_a_binary_or_non_utf8_experiment_is_one_line_exit_2(tmp_path, content):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    p = harness("run", str(path), "--store", str(tmp_path / "runs"))
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and str(path) in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "runs").exists()


def test_gpus_on_a_gpu_less_machine_is_a_clean_exit_2(tmp_path):
    if subprocess.run(["sh", "-c", "command -v nvidia-smi"], capture_output=True).returncode == 0:
        pytest.skip("this machine has nvidia-smi")
    p = harness("run", "experiments/softmax.yaml", "--gpus", "2", "--store", str(tmp_path))
    assert p.returncode == 2
    assert p.stderr.strip() == ("error: --gpus 2: no NVIDIA GPU on this host (nvidia-smi lists "
                                "none); drop --gpus to run on the CPU")
    assert not list(tmp_path.iterdir())


def test_ray_missing_is_one_line_naming_the_install(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_ray(name, *a, **kw):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(HarnessError, match=r"--ray needs Ray: pip install -e '\.\[ray\]'"):
        make_executor(ray="local")


@pytest.mark.slow
def test_ray_local_smoke_sweep_of_softmax_lands_a_normal_run(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    # torch_compile's cases are left out: Inductor's CPU build is no part of what Ray does
    p = harness("run", "experiments/softmax.yaml", "--ray", "local", "--store", str(tmp_path),
                "--cases", "torch.*,triton.*")
    assert p.returncode == 0, p.stdout + p.stderr
    run = next(d for d in tmp_path.iterdir() if (d / "manifest.json").exists())
    m = store.load_manifest(run)
    assert m["status"] == "complete" and m["device"] == "cpu" and m["smoke"] is True
    assert m["executor"]["kind"] == "ray" and m["executor"]["hosts"]
    cases, results = store.load_cases(run), store.load_results(run)
    assert len(cases) == 4 and set(cases.status) == {"ok"} and results.correct.all()
    assert cases.host.notna().all()
    assert store.load_samples(run).groupby("case_id").size().min() >= 2
    assert sorted(p.name for p in (run / "parts").iterdir()) == ["check.ray.jsonl",
                                                                  "time.ray.jsonl"]


def test_compare_and_verdicts_refuse_a_run_that_mixes_gpu_models(tmp_path):
    from harness.analysis.compare import mixed_gpu_problems
    from harness.store.results import gpu_models
    import pandas as pd
    run = store.create_run(tmp_path, "x", {"experiment": {"name": "x"}})
    store.write_table(run, "cases", pd.DataFrame({
        "case_id": ["a", "b"], "gpu_name": ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]}))
    assert gpu_models(store.load_cases(run)) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    probs = mixed_gpu_problems(run, store.load_manifest(run))
    assert len(probs) == 1 and "mixes GPU models" in probs[0]


def test_wall_line_and_run_env_of_the_first_gpu():
    from harness.execute.runner import _run_env, wall_line
    assert wall_line({"total": 130.44, "nsys": 25.3, "check": 41.2, "time": 33.0,
                      "ncu": 20.1}) == ("wall: check 41.2 s · time 33.0 s · ncu 20.1 s · "
                                        "nsys 25.3 s · total 130.4 s")
    gpu1 = {"gpu_name": "NVIDIA H200", "sm_clock_mhz": 1980.0, "gpu_temp_c": 41.0}
    env = _run_env("cpu", GpuExecutor([1], {1: gpu1}))
    assert env["gpu_name"] == "NVIDIA H200" and env["sm_clock_mhz"] == 1980.0


@pytest.mark.slow
def test_ctrl_c_stops_every_gpu_worker_and_the_run_resumes(tmp_path, test_ops, monkeypatch):
    import _thread
    import threading
    from harness.execute.executors.process import Interrupted
    monkeypatch.setenv("HARNESS_TEST_SLOW_S", "0.5")
    run, ids = _run_dir(tmp_path, ["slow"], n=(64, 100, 1000))
    ex = GpuExecutor([0, 1])
    fired = threading.Event()

    def on_event(ev):  # Ctrl-C as soon as the first case is recorded
        if ev["event"] == "done" and not fired.is_set():
            fired.set()
            _thread.interrupt_main()

    with pytest.raises(Interrupted):
        ex.measure(run, ids, {}, {c: 60.0 for c in ids}, "cpu", on_event)
        time.sleep(30)  # the interrupt lands in the join loop or here
    done = {r["case_id"] for r in store.read_parts(run, "check")}
    assert 0 < len(done) < len(ids)
    assert not [r for r in store.read_parts(run, "check") if r["status"] != "ok"]
    monkeypatch.setenv("HARNESS_TEST_SLOW_S", "0.01")
    ex.measure(run, ids, {}, {c: 60.0 for c in ids}, "cpu", lambda ev: None)
    assert {r["case_id"] for r in store.read_parts(run, "time")} == set(ids)


# -- profiler passes sharded over the GPUs ----------------------------------------------------------

_WRAP = ("import os, pathlib, subprocess, sys; out = pathlib.Path(sys.argv[1]); "
         "argv = sys.argv[2:]; out.joinpath('seen.json').write_text(__import__('json').dumps("
         "{'cases': argv[argv.index('--cases') + 1].split(','), "
         "'gpu': os.environ.get('CUDA_VISIBLE_DEVICES')})); "
         "sys.exit(subprocess.call(argv))")


def test_shard_by_impl_keeps_light_implementations_whole_and_splits_the_tail():
    from harness.execute.executors.schedule import PROFILE_SETUP_S as S, shard_by_impl
    ids = [f"{i}.N={n}" for i in ("a", "b", "c") for n in (1, 2, 3)]
    impl_of = {c: c.split(".")[0] for c in ids}
    # light implementations: each whole on one GPU, a balanced pair
    even = {c: {"a": 4.0, "b": 3.0, "c": 1.0}[impl_of[c]] for c in ids}
    parts = shard_by_impl(ids, impl_of, even, 2)
    assert sorted(sum(parts, [])) == sorted(ids)
    for p in parts:
        assert p == [c for c in ids if c in p]  # the given order inside a shard
    by_impl = {impl_of[c]: i for i, p in enumerate(parts) for c in p}
    assert by_impl["a"] != by_impl["b"] == by_impl["c"]
    # one implementation heavier than half of everything (torch.compile under nsys): cut in
    # two, each piece paying the start-up again; the pass's tail drops from a's 95 s
    heavy = {c: (30.0 if c.startswith("a") else 1.0) for c in ids}
    parts = shard_by_impl(ids, impl_of, heavy, 2)
    assert sorted(sum(parts, [])) == sorted(ids)
    assert all(any(impl_of[c] == "a" for c in p) for p in parts)
    load = [sum(heavy[c] for c in p) + S * len({impl_of[c] for c in p}) for p in parts]
    assert max(load) == 2 * 30.0 + S < 3 * 30.0 + S
    assert shard_by_impl(ids, impl_of, heavy, 1) == [ids]  # one GPU: nothing to split


def test_measure_left_is_each_gpus_later_timings_not_done_yet(tmp_path, test_ops):
    """What each GPU's time pass still has to do when the profilers are planned: its cases'
    first timings (wall_s) for every later process that has not timed them yet."""
    from harness.execute.profiler_early import measure_left_s

    run, ids = _run_dir(tmp_path, ["zeros"])
    m = store.load_manifest(run)
    store.update_manifest(run, experiment={**m["experiment"],
                                           "timing": {**m["experiment"]["timing"],
                                                      "processes": 3}})
    walls = {0: [2.0, 1.0], 1: [4.0, 3.0]}
    for g, ws in walls.items():
        for c, w in zip(ids[2 * g:2 * g + 2], ws):
            store.append_part(run, "time", {"case_id": c, "status": "ok", "wall_s": w,
                                            "gpu": g}, shard=f"gpu{g}")
    store.append_part(run, "time", {"case_id": "x", "status": "error", "wall_s": 9.0,
                                    "gpu": 1}, shard="gpu1")  # not timed again
    store.append_part(run, "time_p2", {"case_id": ids[0], "status": "ok"}, shard="gpu0")
    store.append_part(run, "time_p2", {"case_id": ids[2], "status": "ok"}, shard="gpu1")
    # GPU 0: p2 has 1.0 left, p3 3.0; GPU 1: p2 3.0, p3 7.0; GPU 2 measured nothing
    assert measure_left_s(run, [0, 1, 2]) == [4.0, 10.0, 0.0]


def test_measure_left_estimates_a_gpus_cases_not_timed_yet(tmp_path, test_ops):
    """Planned before every case has its first timing (profilers_due), a GPU's cases not yet
    timed count once per time process, at their estimated cost scaled by what the first
    timings so far took against their estimates."""
    from harness.execute.profiler_early import measure_left_s

    run, ids = _run_dir(tmp_path, ["zeros"])  # 4 cases; 2 time processes on a GPU run
    store.update_manifest(run, device="cuda")
    est = dict(zip(ids, [1.0, 1.0, 2.0, 4.0]))
    store.append_part(run, "time", {"case_id": ids[0], "status": "ok", "wall_s": 0.5,
                                    "gpu": 0}, shard="gpu0")
    store.append_part(run, "time", {"case_id": ids[1], "status": "ok", "wall_s": 1.5,
                                    "gpu": 0}, shard="gpu0")
    store.append_part(run, "time_p2", {"case_id": ids[0], "status": "ok"}, shard="gpu0")
    planned = {0: ids[:2], 1: ids[2:]}
    # GPU 0: its p2 has ids[1] left (1.5 s); GPU 1: two untimed cases, 2 processes each, at
    # (0.5 + 1.5) / (1 + 1) = 1x their estimates
    assert measure_left_s(run, [0, 1], planned, est) == pytest.approx([1.5, 2 * (2.0 + 4.0)])
    assert measure_left_s(run, [0, 1]) == pytest.approx([1.5, 0.0])  # as before: no plan


def test_profilers_are_due_when_one_gpu_has_its_first_timings_and_all_are_checked():
    from harness.execute.profiler_early import profilers_due

    planned = {0: ["a", "b"], 1: ["c", "d"]}
    yes, no = (lambda: True), (lambda: False)
    assert profilers_due(set(), None, no)  # every case timed: always
    assert not profilers_due({"a"}, None, yes)  # one GPU: only then
    assert not profilers_due({"a"}, {0: ["a", "b"]}, yes)
    assert not profilers_due({"a", "c"}, planned, yes)  # both GPUs still time a first time
    assert profilers_due({"c"}, planned, yes)  # GPU 0's done, every case checked
    assert not profilers_due({"c"}, planned, no)  # a case still unchecked: its status unknown


def test_profile_cases_untimed_and_a_case_failed_since_the_deal(tmp_path, test_ops):
    """Dealt before every case was timed, a checked case counts; one whose timing fails
    before its process's turn is left out of the ids that turn gives."""
    from harness.execute.runner import Runner
    from harness.store.results import consolidate
    from harness.registry import registry

    run, ids = _run_dir(tmp_path, ["zeros"])
    for c in ids:
        store.append_part(run, "check", {"case_id": c, "status": "ok", "correct": True})
    for c in ids[:2]:
        store.append_part(run, "time", {"case_id": c, "status": "ok", "median_ms": 1.0,
                                        "samples": [1.0], "wall_s": 0.1})
    consolidate(run, registry().get_op("scale2"))
    r = Runner(run, Console(file=open(os.devnull, "w")), GpuExecutor([0, 1]))
    assert r.profile_cases("all") == ids[:2]  # the others are pending
    assert r.profile_cases("all", untimed=True) == ids
    assert r.unfailed(ids) == ids
    store.append_part(run, "time", {"case_id": ids[3], "status": "error", "error": "boom"})
    assert r.unfailed(ids) == ids[:3]


def test_joint_profiler_shards_weigh_what_loading_each_case_cost(tmp_path, test_ops):
    """A cold run (no earlier profile) weighs a unit's start-up by what its cases' first calls
    cost a fresh process of this run (parts/load, written by the time pass's later process):
    an implementation that loads for 10 s a case is heavy under both profilers, so its two
    processes go to different GPUs; without load records every unit pays the flat prior."""
    from harness.execute.prewarm import LOAD_PART, load_seconds
    from harness.execute.runner import Runner

    run, ids = _run_dir(tmp_path, ["zeros", "nan"])
    r = Runner(run, Console(file=open(os.devnull, "w")), GpuExecutor([0, 1]))
    passes = [SimpleNamespace(name="ncu", cases=ids), SimpleNamespace(name="nsys", cases=ids)]

    def where(shards):  # (pass, impl) -> the GPU its cases went to
        out = {}
        for p, per in zip(("ncu", "nsys"), shards):
            for gpu, cases, _ in per:
                for c in cases:
                    assert out.setdefault((p, c.split(".")[0]), gpu) == gpu  # one process
        return out
    assert sorted(where(r._joint_shards(passes, [0, 1]))) == sorted(
        (p, i) for p in ("ncu", "nsys") for i in ("torch", "zeros", "nan"))
    for c in ids:  # the torch baseline loads nothing: no record
        if not c.startswith("torch."):
            store.append_part(run, LOAD_PART, {"case_id": c, "status": "ok",
                                               "load_s": 10.0 if c.startswith("zeros.") else 0.1},
                              shard="gpu1")
    assert load_seconds(run) == {c: (10.0 if c.startswith("zeros.") else 0.1) for c in ids
                                 if not c.startswith("torch.")}
    got = where(r._joint_shards(passes, [0, 1]))
    assert got[("ncu", "zeros")] != got[("nsys", "zeros")]


def test_joint_profiler_shards_weigh_a_cold_case_by_its_timed_median(tmp_path, test_ops):
    """No earlier profile: a case's seconds under ncu follow its first timing's median
    (profiler_deal.case_prior_s). Untimed, every case weighs the same and each implementation
    stays in one process; timed at 20 ms a call, one implementation outweighs a GPU's fair
    share and is cut in two, one piece on each GPU, and the plan counts its seconds."""
    from harness.execute.executors.profiler_deal import case_prior_s
    from harness.execute.runner import Runner

    run, ids = _run_dir(tmp_path, ["zeros", "nan"])
    r = Runner(run, Console(file=open(os.devnull, "w")), GpuExecutor([0, 1]))

    def zeros_on():
        shards = r._joint_shards([SimpleNamespace(name="ncu", cases=ids)], [0, 1])[0]
        return sorted(g for g, cases, _ in shards for c in cases if c.startswith("zeros."))
    assert len(set(zeros_on())) == 1
    for c in ids:
        store.append_part(run, "time", {"case_id": c, "status": "ok", "wall_s": 0.1,
                                        "median_ms": 20.0 if c.startswith("zeros.") else 0.1})
    assert zeros_on() == [0, 1]
    plan = store.load_manifest(run)["profiler_plan"]
    assert all(g["end_s"] - plan["at_s"] >= case_prior_s("ncu", 20.0) for g in plan["gpus"])


def test_profile_shards_weigh_cases_by_the_previous_runs_profiler_seconds(tmp_path):
    from harness.execute.previous import previous_profile_s
    from run_factory import write_run

    old = write_run(tmp_path, minutes=0, medians={"a/64": 1.0})
    new = write_run(tmp_path, minutes=5, medians={"a/64": 1.0})
    assert previous_profile_s(new, "nsys") == {}
    store.update_manifest(old, profiler_wall_s={"nsys": {"per_case_s": {"a.N=1": 12.5,
                                                                        "b.N=1": 0.4}}})
    assert previous_profile_s(new, "nsys") == {"a.N=1": 12.5, "b.N=1": 0.4}
    assert previous_profile_s(new, "ncu") == {}
    assert previous_profile_s(old, "nsys") == {}  # only earlier runs count


def _fake_profiler(name):
    """A profiler that runs the worker and reports, per case, the GPU its process was pinned to."""
    import pandas as pd

    from harness.profilers import base

    class Fake(base.Profiler):
        def availability(self):
            return base.Availability(True, "fake")

        def command(self, worker_argv, out_dir, options):
            return [sys.executable, "-c", _WRAP, str(out_dir), *worker_argv]

        def parse(self, out_dir):
            seen = json.loads((out_dir / "seen.json").read_text())
            return pd.DataFrame([{"case_id": c, "source": self.source, "kernel": "k",
                                  "name": "gpu", "value": float(seen["gpu"]), "unit": ""}
                                 for c in seen["cases"]], columns=base.METRIC_COLUMNS)

    Fake.name = Fake.source = name
    return Fake


@pytest.mark.slow
def test_profiler_passes_share_the_gpus_side_by_side(tmp_path, test_ops, monkeypatch):
    """With two GPUs, two profiler passes are dealt onto them together: the heavy pass's one
    implementation on one GPU while the light pass runs whole on the other (one pass after the
    other, each would split over both GPUs); every case profiled once by each pass, the
    metrics of both merged, the passes' shared wall recorded."""
    from rich.progress import Progress

    from harness.profilers import base
    from harness.execute.runner import Runner, wall_line

    for name in ("slowprof", "fastprof"):
        monkeypatch.setitem(base._REGISTRY, name, _fake_profiler(name))
    earlier, ids = _run_dir(tmp_path, ["zeros", "nan"])
    slow_ids = [c for c in ids if c.startswith("zeros.")]
    # what the earlier run measured: slowprof 30 s a case (one implementation), fastprof 10 s
    # (three: the baseline too)
    store.update_manifest(earlier, profiler_wall_s={
        "slowprof": {"per_case_s": dict.fromkeys(slow_ids, 30.0)},
        "fastprof": {"per_case_s": dict.fromkeys(ids, 10.0)}})
    time.sleep(1.1)  # run ids are per second
    run, _ = _run_dir(tmp_path, ["zeros", "nan"])
    r = Runner(run, Console(file=open(os.devnull, "w")), GpuExecutor([0, 1]))
    r.profile_cases = lambda which, untimed=False: slow_ids if which == "slow" else ids
    idle = []  # each GPU, once its last profiler process's cases are over (calibrate.Early)
    r.gpu_idle = idle.append
    with Progress(console=Console(file=open(os.devnull, "w"))) as progress:
        r.profile_passes(progress, [("slowprof", SimpleNamespace(cases="slow", timeout_s=120)),
                                    ("fastprof", SimpleNamespace(cases="all", timeout_s=120))])
    assert sorted(idle) == [0, 1]
    assert r.passes["slowprof"] == r.passes["fastprof"] == "done", r.passes
    m = store.load_metrics(run)
    assert sorted(m[m.source == "slowprof"].case_id) == sorted(slow_ids)
    assert sorted(m[m.source == "fastprof"].case_id) == sorted(ids)
    gpus = {src: set(m[m.source == src].value) for src in ("slowprof", "fastprof")}
    assert len(gpus["slowprof"]) == len(gpus["fastprof"]) == 1, gpus
    assert gpus["slowprof"] | gpus["fastprof"] == {0.0, 1.0}, gpus
    # one process each: its report where a one-GPU pass keeps it
    assert (run / "raw" / "fastprof" / "fastprof.log").exists()
    wall = store.load_manifest(run)["profiler_wall_s"]
    assert wall["slowprof"]["side_by_side"] and wall["fastprof"]["side_by_side"]
    assert sorted(wall["fastprof"]["per_case_s"]) == sorted(ids)
    for rec in (wall["slowprof"], wall["fastprof"]):  # the span's parts besides the cases
        assert 0 <= rec["to_first_case_s"] <= rec["run_s"] and 0 <= rec["after_last_s"]
        assert rec["to_first_case_s"] + sum(rec["per_case_s"].values()) <= rec["run_s"] + 0.1
    assert r.pass_wall["slowprof+fastprof"] >= max(r.pass_wall["slowprof"],
                                                   r.pass_wall["fastprof"]) - 0.05
    assert "ncu+nsys 3.0 s" in wall_line({"ncu": 2.0, "nsys": 2.5, "ncu+nsys": 3.0, "total": 9})
    spans = r.timeline.record()  # each GPU's process from its turn, then the exports
    lanes = {k for k in spans if "@gpu" in k}
    assert {k.split("@")[0] for k in lanes} == {"slowprof", "fastprof"}, spans
    assert {k.split("@")[1] for k in lanes} == {"gpu0", "gpu1"}, spans
    assert {"slowprof export", "fastprof export"} <= set(spans), spans
    for k in lanes:
        assert 0 <= spans[k][0] <= spans[k][1] <= spans[f"{k.split('@')[0]} export"][1]
    # the deal's expected ends, against each GPU's last process's end (`show`'s plan line)
    from harness.execute.timeline import plan_line

    plan = store.load_manifest(run)["profiler_plan"]
    assert [g["gpu"] for g in plan["gpus"]] == [0, 1] and 0 <= plan["at_s"]
    assert {p for g in plan["gpus"] for p in g["cases"]} == {"slowprof", "fastprof"}
    assert sum(g["cases"].get("fastprof", 0) for g in plan["gpus"]) == len(ids)
    assert all(g["end_s"] > plan["at_s"] for g in plan["gpus"])
    ended = {g: max(b for k, (_, b) in spans.items() if k.endswith(f"@gpu{g}")) for g in (0, 1)}
    line = plan_line(plan, spans)
    assert line.startswith(f"profilers' plan (at {plan['at_s']:.1f} s): GPU 0 done at ~")
    assert f"ended {ended[0]:.1f} · GPU 1" in line and line.endswith(f"ended {ended[1]:.1f}")
    assert plan_line(None, spans) is None
    # one pass alone still splits over both GPUs
    r2 = Runner(run, Console(file=open(os.devnull, "w")), GpuExecutor([0, 1]))
    r2.profile_cases = lambda which, untimed=False: ids
    with Progress(console=Console(file=open(os.devnull, "w"))) as progress:
        r2.profile_passes(progress, [("fastprof", SimpleNamespace(cases="all", timeout_s=120))])
    m = store.load_metrics(run)
    assert set(m[m.source == "fastprof"].value) == {0.0, 1.0}
    assert store.load_manifest(run).get("profiler_plan") is None  # no deal: the last one gone
    # each of its processes says where its own run went besides its cases
    rec = store.load_manifest(run)["profiler_wall_s"]["fastprof"]
    procs = rec["processes"]
    assert sorted(p["gpu"] for p in procs) == [0, 1]
    assert sum(p["cases"] for p in procs) == len(ids)
    for p in procs:
        assert 0 <= p["to_first_case_s"] <= p["run_s"] <= rec["run_s"] + 0.05
        assert 0 <= p["after_last_s"] <= p["run_s"]
    assert "processes" not in wall["slowprof"]  # one process: the pass's figures are its own


@pytest.mark.slow
def test_profiler_pass_shards_implementations_over_gpus_and_merges(tmp_path, test_ops,
                                                                   monkeypatch):
    """One profiler process per GPU, each with whole implementations, its own raw/<prof>/gpu<i>/
    and part file; the metrics of both land in the run's table."""
    from rich.progress import Progress

    from harness.profilers import base
    from harness.execute.runner import Runner

    monkeypatch.setitem(base._REGISTRY, "fakeprof", _fake_profiler("fakeprof"))
    run, ids = _run_dir(tmp_path, ["zeros", "nan"])
    r = Runner(run, Console(file=open(os.devnull, "w")), GpuExecutor([0, 1]))
    r.profile_cases = lambda which, untimed=False: ids
    opts = SimpleNamespace(cases="all", timeout_s=120)
    with Progress(console=Console(file=open(os.devnull, "w"))) as progress:
        r.profile(progress, "fakeprof", opts)
    assert r.passes["fakeprof"] == "done", r.passes
    m = store.load_metrics(run)
    gpu_of = dict(zip(m.case_id, m.value))
    assert set(gpu_of) == set(ids)
    impl_gpu = {}
    for c, g in gpu_of.items():
        impl_gpu.setdefault(c.split(".")[0], set()).add(g)
    assert all(len(g) == 1 for g in impl_gpu.values()), impl_gpu  # an impl stays on one GPU
    assert set().union(*impl_gpu.values()) == {0.0, 1.0}             # both GPUs worked
    for g in (0, 1):
        assert (run / "raw" / "fakeprof" / f"gpu{g}" / "fakeprof.log").exists()
    parts = sorted(p.name for p in (run / "parts").iterdir() if p.name.startswith("fakeprof"))
    assert parts == ["fakeprof.gpu0.jsonl", "fakeprof.gpu1.jsonl"]
    assert {rec["case_id"] for rec in store.read_parts(run, "fakeprof")} == set(ids)
    wall = store.load_manifest(run)["profiler_wall_s"]["fakeprof"]
    assert sorted(wall["gpus"]) == ["0", "1"] and wall["cases"] == len(ids)


_TIMED_WRAP = ("import json, pathlib, subprocess, sys, time; out = pathlib.Path(sys.argv[1]); "
               "t0 = time.time(); rc = subprocess.call(sys.argv[2:]); time.sleep(2.0); "
               "out.joinpath('times.json').write_text(json.dumps([t0, time.time()])); "
               "sys.exit(rc)")


@pytest.mark.slow
def test_one_gpus_profiler_passes_start_together_and_run_in_turn(tmp_path, test_ops,
                                                                 monkeypatch):
    """On one GPU the second pass's process starts with the first (its start-up overlaps the
    first pass), calls its cases once (`--prewarm`) and waits for its turn (`--wait-for`)
    before its first case; the turn comes when the first process's cases are done (its
    `end`), while its profiler still writes its report (here two seconds' sleep after the
    worker). Both processes share the GPU's lock (a profiled call holds it alone); both
    passes land as one pass after the other would."""
    from rich.progress import Progress

    from harness.profilers import base
    from harness.execute.runner import Runner

    def timed(name, pause=0.0):
        cls = _fake_profiler(name)
        cls.command = lambda self, argv, out_dir, options: [
            sys.executable, "-c", f"import time; time.sleep({pause}); " + _TIMED_WRAP,
            str(out_dir), *argv]
        cls.parse = lambda self, out_dir: __import__("pandas").DataFrame(
            [{"case_id": c, "source": name, "kernel": "k", "name": "x", "value": 1.0,
              "unit": ""} for c in ids], columns=base.METRIC_COLUMNS)
        return cls

    run, ids = _run_dir(tmp_path, ["zeros"])
    monkeypatch.setitem(base._REGISTRY, "firstprof", timed("firstprof", pause=10.0))
    monkeypatch.setitem(base._REGISTRY, "secondprof", timed("secondprof"))
    r = Runner(run, Console(file=open(os.devnull, "w")))
    r.profile_cases = lambda which, untimed=False: ids
    # the second process's limit (8 s) is shorter than the first pass: it runs from its turn
    with Progress(console=Console(file=open(os.devnull, "w"))) as progress:
        r.profile_passes(progress, [
            ("firstprof", SimpleNamespace(cases="all", timeout_s=120)),
            ("secondprof", SimpleNamespace(cases="all", timeout_s=8.0))])
    assert r.passes["firstprof"] == r.passes["secondprof"] == "done", r.passes
    m = store.load_metrics(run)
    assert sorted(m.source.unique()) == ["firstprof", "secondprof"]
    first = json.loads((run / "raw" / "firstprof" / "times.json").read_text())
    second = json.loads((run / "raw" / "secondprof" / "times.json").read_text())
    assert second[0] < first[1]  # started before the first pass was over
    log = (run / "raw" / "secondprof" / "secondprof.log").read_text()
    assert "--prewarm --wait-for" in log and "--wait-for" not in (
        run / "raw" / "firstprof" / "firstprof.log").read_text()
    assert {rec["case_id"] for rec in store.read_parts(run, "secondprof")} == set(ids)
    # profiled after the first process's last case, before that process had ended
    done_first = (run / "parts" / "firstprof.jsonl").stat().st_mtime
    assert done_first <= (run / "parts" / "secondprof.jsonl").stat().st_mtime < first[1]
    assert not (run / "raw" / "locks").exists()


@pytest.mark.slow
def test_side_by_side_processes_of_one_gpu_start_together_and_run_in_turn(tmp_path, test_ops,
                                                                         monkeypatch):
    """With --gpus, a GPU dealt several profiler processes starts them together: each after
    the first loads its cases (`--prewarm`) and waits for its turn (`--wait-for`), which
    comes when the one before has done its cases, as one GPU's passes do; a pass's span
    starts at its turn."""
    from rich.progress import Progress

    from harness.profilers import base
    from harness.execute.runner import Runner

    def timed(name, pause=0.0):
        cls = _fake_profiler(name)
        cls.command = lambda self, argv, out_dir, options: [
            sys.executable, "-c", f"import time; time.sleep({pause}); " + _TIMED_WRAP,
            str(out_dir), *argv]
        return cls

    run, ids = _run_dir(tmp_path, ["zeros"])
    monkeypatch.setitem(base._REGISTRY, "firstprof", timed("firstprof", pause=10.0))
    monkeypatch.setitem(base._REGISTRY, "secondprof", timed("secondprof"))
    r = Runner(run, Console(file=open(os.devnull, "w")), GpuExecutor([0, 1]))
    r.profile_cases = lambda which, untimed=False: ids
    # the second process's limit (8 s) is shorter than its wait: it runs from its turn
    with Progress(console=Console(file=open(os.devnull, "w"))) as progress:
        passes = [r._plan_pass(progress, name, SimpleNamespace(cases="all", timeout_s=limit))
                  for name, limit in (("firstprof", 120), ("secondprof", 8.0))]
    for p in passes:  # both on GPU 0, one process each: one lane of two
        out = store.raw_dir(run, p.name, "gpu0")
        p.shards = [(0, ids, out)]
    exported = {}  # each shard's export: when it began (wall clock), in the lane's own thread

    def export(p, i):
        exported[p.name] = time.time()
        r._export_one(p, i)
    r._run_processes(passes, after=export)
    first = json.loads((run / "raw" / "firstprof" / "gpu0" / "times.json").read_text())
    second = json.loads((run / "raw" / "secondprof" / "gpu0" / "times.json").read_text())
    # the first's export: once its process had ended, while the second's still ran
    assert first[1] <= exported["firstprof"] < second[1]
    assert second[1] <= exported["secondprof"]
    assert all(0 in p.finished for p in passes)  # (what parsing said is kept in it)
    r._export(passes)  # nothing left to export: the shards' exports are kept
    assert passes[0].finished[0]["export_end"] <= passes[1].finished[0]["export_end"]
    assert second[0] < first[1]  # started before the first process was over
    assert "--prewarm --wait-for" in (run / "raw" / "secondprof" / "gpu0" /
                                      "secondprof.log").read_text()
    assert "--wait-for" not in (run / "raw" / "firstprof" / "gpu0" / "firstprof.log").read_text()
    assert {rec["case_id"] for rec in store.read_parts(run, "secondprof")} == set(ids)
    # its turn: when the first's cases were done, before the first process had ended
    done_first = (run / "parts" / "firstprof.jsonl").stat().st_mtime
    assert done_first <= (run / "parts" / "secondprof.jsonl").stat().st_mtime < first[1]
    assert passes[0].cases_over(0).is_set()
    # its span: from its turn, not its start
    assert passes[0].edges["last_done"] <= passes[1].span[0] < passes[0].span[1]
    assert passes[0].outcome[0] == passes[1].outcome[0] == (0, False)
    assert sorted(passes[1].per_case) == sorted(ids)  # its profiled cases, not its prewarm
    assert not (run / "raw" / "locks").exists()


@pytest.mark.slow
def test_profiler_processes_started_early_load_and_wait_for_the_measure_passes(tmp_path,
                                                                               test_ops,
                                                                               monkeypatch):
    """start_early's path: every profiler process, the first pass's too, starts at once and
    does nothing until `go` (the measure passes' end): then the first profiles, the second
    loads its cases (`--load-after`, then `--prewarm`) and takes its turn once the first has
    done its cases; the passes land as they would have, their spans from the first turn."""
    import threading

    from rich.progress import Progress

    from harness.execute.profiler_passes import Early
    from harness.execute.runner import Runner
    from harness.profilers import base

    def timed(name):
        cls = _fake_profiler(name)
        cls.command = lambda self, argv, out_dir, options: [
            sys.executable, "-c", _TIMED_WRAP, str(out_dir), *argv]
        cls.parse = lambda self, out_dir: __import__("pandas").DataFrame(
            [{"case_id": c, "source": name, "kernel": "k", "name": "x", "value": 1.0,
              "unit": ""} for c in ids], columns=base.METRIC_COLUMNS)
        return cls

    run, ids = _run_dir(tmp_path, ["zeros"])
    for name in ("firstprof", "secondprof"):
        monkeypatch.setitem(base._REGISTRY, name, timed(name))
    r = Runner(run, Console(file=open(os.devnull, "w")))
    r.profile_cases = lambda which, untimed=False: ids
    early = r._early = Early()
    todo = [("firstprof", SimpleNamespace(cases="all", timeout_s=120)),
            ("secondprof", SimpleNamespace(cases="all", timeout_s=120))]
    with Progress(console=Console(file=open(os.devnull, "w"))) as progress:
        t = early.thread = threading.Thread(target=r.profile_passes, args=(progress, todo, early))
        t.start()
        assert early.planned.wait(60)
        logs = [run / "raw" / n / f"{n}.log" for n in ("firstprof", "secondprof")]
        time.sleep(3.0)  # the processes start, load and wait
        assert not store.read_parts(run, "firstprof")  # nothing profiled before its turn
        go_wall = time.time()
        assert (run / "raw" / "locks").exists()
        r._finish_early()  # the runner's thread: the turn, then the run's locks removed
    assert not t.is_alive()
    assert r.passes["firstprof"] == r.passes["secondprof"] == "done", r.passes
    first = json.loads((run / "raw" / "firstprof" / "times.json").read_text())
    second = json.loads((run / "raw" / "secondprof" / "times.json").read_text())
    assert first[0] < go_wall and second[0] < go_wall  # both started before the turn
    first_log, second_log = (log.read_text() for log in logs)
    assert "--wait-for" in first_log and "--prewarm" not in first_log
    assert "--load-after" in second_log and "--prewarm --wait-for" in second_log
    assert (run / "parts" / "firstprof.jsonl").stat().st_mtime > go_wall
    # in turn: after the first's last case, before its profiler (the wrapper) had ended
    done_first = (run / "parts" / "firstprof.jsonl").stat().st_mtime
    assert done_first <= (run / "parts" / "secondprof.jsonl").stat().st_mtime < first[1]
    m = store.load_manifest(run)
    assert all(m["profiler_wall_s"][n]["started_early"] for n in ("firstprof", "secondprof"))
    # when each had set itself up (worker.touch, its `ready`), from its turn: before its first
    # case (before the turn too, unless starting up took longer than the test's wait)
    for n in ("firstprof", "secondprof"):
        rec = m["profiler_wall_s"][n]
        assert isinstance(rec["ready_s"], float) and rec["ready_s"] <= rec["to_first_case_s"]
    assert sorted(store.load_metrics(run).source.unique()) == ["firstprof", "secondprof"]
    assert not (run / "raw" / "locks").exists()


@pytest.mark.slow
def test_profiler_processes_started_early_are_stopped_with_the_run(tmp_path, test_ops,
                                                                   monkeypatch):
    """A measure pass that fails or is interrupted stops the waiting profiler processes: the
    pass raises Interrupted, no process is left and nothing was profiled."""
    import threading

    from rich.progress import Progress

    from harness.execute.executors.process import Interrupted
    from harness.execute.profiler_passes import Early
    from harness.execute.runner import Runner
    from harness.profilers import base

    run, ids = _run_dir(tmp_path, ["zeros"])
    monkeypatch.setitem(base._REGISTRY, "fakeprof", _fake_profiler("fakeprof"))
    r = Runner(run, Console(file=open(os.devnull, "w")))
    r.profile_cases = lambda which, untimed=False: ids
    early, raised = Early(), []
    r._early = early

    def passes():
        try:
            r.profile_passes(progress, [("fakeprof", SimpleNamespace(cases="all",
                                                                     timeout_s=120))], early)
        except Interrupted:
            raised.append(True)

    with Progress(console=Console(file=open(os.devnull, "w"))) as progress:
        t = early.thread = threading.Thread(target=passes)
        t.start()
        assert early.planned.wait(60)
        time.sleep(2.0)
        r.stop_early()  # the measure passes failed: kill, wait, remove the locks
    assert not t.is_alive() and raised == [True]
    assert not store.read_parts(run, "fakeprof")
    assert not (run / "raw" / "locks").exists()


@pytest.mark.slow
def test_the_runner_starts_the_profilers_once_every_case_has_its_first_timing(
        tmp_path, test_ops, monkeypatch):
    """Runner.measure calls start_early when the time pass's first process has timed every
    case, before its second process times any: every case's status is final by then."""
    from rich.progress import Progress

    from harness.execute.runner import Runner

    run, ids = _run_dir(tmp_path, ["zeros", "nan"], extra={"processes": 2})
    seen = []

    def start_early(self, progress, early):
        seen.append({"time": {r["case_id"] for r in store.read_parts(run, "time")},
                     "check": {r["case_id"] for r in store.read_parts(run, "check")},
                     "p2": len(store.read_parts(run, "time_p2")), "at": time.time()})

    monkeypatch.setattr(Runner, "early_wanted", lambda self: True)
    monkeypatch.setattr(Runner, "start_early", start_early)
    r = Runner(run, Console(file=open(os.devnull, "w")), LocalExecutor())
    with Progress(console=Console(file=open(os.devnull, "w"))) as progress:
        r.measure(progress)
    assert len(seen) == 1
    assert seen[0]["time"] == seen[0]["check"] == set(ids) and seen[0]["p2"] == 0
    assert len(store.read_parts(run, "time_p2")) == len(ids)
    assert (run / "parts" / "time_p2.jsonl").stat().st_mtime > seen[0]["at"]


@pytest.mark.slow
def test_with_gpus_a_gpu_profiles_once_its_own_shard_has_been_measured(tmp_path, test_ops,
                                                                       monkeypatch):
    """--gpus, profiler processes started early: a GPU's processes take their turn when that
    GPU's shard of the measure passes has ended (Early.shard_done), not when every GPU's has
    (Early.release)."""
    import threading

    from rich.progress import Progress

    from harness.execute.profiler_passes import Early
    from harness.execute.runner import Runner
    from harness.profilers import base

    monkeypatch.setitem(base._REGISTRY, "fakeprof", _fake_profiler("fakeprof"))
    run, ids = _run_dir(tmp_path, ["zeros", "nan"])
    r = Runner(run, Console(file=open(os.devnull, "w")), GpuExecutor([0, 1]))
    r.profile_cases = lambda which, untimed=False: ids
    early = r._early = Early()
    with Progress(console=Console(file=open(os.devnull, "w"))) as progress:
        t = early.thread = threading.Thread(target=r.profile_passes, args=(
            progress, [("fakeprof", SimpleNamespace(cases="all", timeout_s=120))], early))
        t.start()
        assert early.planned.wait(60)
        part = {g: run / "parts" / f"fakeprof.gpu{g}.jsonl" for g in (0, 1)}
        time.sleep(2.0)
        assert not part[0].exists() and not part[1].exists()
        early.shard_done(0)
        deadline = time.monotonic() + 60
        while len(store.read_parts(run, "fakeprof")) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # GPU 0's cases: the impl dealt to it
        time.sleep(1.0)
        assert part[0].exists() and not part[1].exists()
        r._finish_early()
    assert not t.is_alive() and r.passes["fakeprof"] == "done", r.passes
    assert {rec["case_id"] for rec in store.read_parts(run, "fakeprof")} == set(ids)
    assert not (run / "raw" / "locks").exists()


def test_profiler_passes_started_early_with_nothing_to_profile_leave_the_locks(tmp_path,
                                                                              test_ops,
                                                                              monkeypatch):
    """Started early with --gpus and every pass skipped (or carried over): nothing runs,
    nothing raises, and the run's locks and turn files, which the measure passes still use,
    stay until the runner's thread removes them."""
    from rich.progress import Progress

    from harness.execute import sharing
    from harness.execute.profiler_passes import Early
    from harness.execute.runner import Runner
    from harness.profilers import base

    gone = _fake_profiler("goneprof")
    gone.availability = lambda self: base.Availability(False, "not installed")
    monkeypatch.setitem(base._REGISTRY, "goneprof", gone)
    run, ids = _run_dir(tmp_path, ["zeros"])
    r = Runner(run, Console(file=open(os.devnull, "w")), GpuExecutor([0, 1]))
    r.profile_cases = lambda which, untimed=False: ids
    turn = sharing.turn_file(run, "time_p2.gpu0")  # a measure pass's, still waited on
    with Progress(console=Console(file=open(os.devnull, "w"))) as progress:
        r.profile_passes(progress, [("goneprof", SimpleNamespace(cases="all", timeout_s=60))],
                         Early())
    assert r.passes["goneprof"].startswith("skipped"), r.passes
    assert turn.parent.exists()
