"""Compile-ahead (harness.execute.executors.warm): a few worker processes call each case of the
implementations that JIT-compile before the check pass, with the Tuners compiling every
candidate and timing none. Run here with real CPU worker processes and the self-test op."""
import json
import os
from pathlib import Path

import pytest

from harness import store, tuning

from harness.experiment import spec
from harness.execute.executors.schedule import compile_workers, warm_shards
from harness.execute.executors.warm import compile_ahead
from kernels._tuner import Tuner

from test_executors import _run_dir


def test_warm_shards_deal_round_robin_in_check_order():
    ids = [f"c{i}" for i in range(7)]
    assert warm_shards(ids, 3) == [["c0", "c3", "c6"], ["c1", "c4"], ["c2", "c5"]]
    assert warm_shards(ids[:2], 4) == [["c0"], ["c1"]]
    with pytest.raises(ValueError):
        warm_shards(ids, 0)


def _classes(impls: dict[str, str], n_classes: int, per_class: int):
    """Check-ordered case ids of impls {name: backend}, `n_classes` compile classes each (two
    dtypes of n_classes // 2 param sets) with `per_class` sizes; unit_of and backend_of."""
    ids, unit_of, backend_of = [], {}, {}
    for size in range(per_class):  # check order: a shape's cases together, largest first
        for k in range(n_classes):
            for impl, backend in impls.items():
                c = f"{impl}.D={k // 2}.S={size}.{'fp16' if k % 2 else 'bf16'}"
                ids.append(c)
                unit_of[c] = (impl, k // 2, "fp16" if k % 2 else "bf16")
                backend_of[c] = backend
    return ids, unit_of, backend_of


def test_warm_shards_keep_a_class_in_one_worker_and_torch_compile_on_few_workers(monkeypatch):
    from harness.execute.executors import schedule

    # the cost model's proportions (its measured values may move): setup 8, a graph 3, other 2
    monkeypatch.setattr(schedule, "WARM_SETUP_S", {"compile": 8.0})
    monkeypatch.setattr(schedule, "WARM_UNIT_S", {"compile": 3.0})
    monkeypatch.setattr(schedule, "WARM_UNIT_DEFAULT_S", 2.0)
    ids, unit_of, backend_of = _classes({"tc": "compile", "tf": "triton", "fm": "triton"}, 8, 5)
    shards = warm_shards(ids, 4, unit_of, backend_of)
    assert sorted(c for s in shards for c in s) == sorted(ids)  # every case, once
    pos = {c: i for i, c in enumerate(ids)}
    assert all(s == sorted(s, key=pos.__getitem__) for s in shards)  # each in check order
    owner = {}
    for i, s in enumerate(shards):
        for c in s:
            assert owner.setdefault(unit_of[c], i) == i  # a class never in two workers
    # torch.compile's per-process setup (WARM_SETUP_S) is paid by two workers, not four; each
    # takes whole param sets (both dtypes of one graph together)
    tc_workers = {owner[u] for u in owner if u[0] == "tc"}
    assert len(tc_workers) == 2
    assert all(owner[("tc", k, "bf16")] == owner[("tc", k, "fp16")] for k in range(4))
    # the Triton classes fill the other two workers
    assert {owner[u] for u in owner if u[0] != "tc"}.isdisjoint(tc_workers)
    # with one class per case, it deals round-robin; with fewer classes than workers, fewer
    assert warm_shards(ids[:3], 4, unit_of, backend_of) == [[ids[0]], [ids[1]], [ids[2]]]
    same = dict.fromkeys(ids, ("one",))
    assert warm_shards(ids, 4, same, backend_of) == [ids]
    # a single torch.compile class among many Triton ones: one worker pays the setup
    solo = {c: u for c, u in unit_of.items()}
    for c in ids:
        if c.startswith("tc"):
            solo[c] = ("tc",)
    shards = warm_shards(ids, 4, solo, backend_of)
    assert sum(any(c.startswith("tc") for c in s) for s in shards) == 1


def test_warm_shards_spread_an_implementations_classes_over_the_workers():
    # the model weighs every Triton class alike; two implementations' classes that cost
    # differently (on two H100s triton_flash's 7-9 s, fused_mha's 5-7 s) must not pair up by
    # implementation on the workers that equal loads favour
    ids, unit_of, backend_of = _classes({"tc": "compile", "tf": "triton", "fm": "triton"}, 8, 5)
    for n in (16, 8, 6):
        shards = warm_shards(ids, n, unit_of, backend_of)
        assert sorted(c for s in shards for c in s) == sorted(ids)
        for s in shards:
            classes = {unit_of[c] for c in s}
            tf = sum(u[0] == "tf" for u in classes)
            fm = sum(u[0] == "fm" for u in classes)
            assert abs(tf - fm) <= 1, (n, sorted(classes))
    # sixteen workers: torch.compile's eight graphs on eight, each other worker one class of
    # each Triton implementation
    shards = warm_shards(ids, 16, unit_of, backend_of)
    mixed = [s for s in shards if not any(c.startswith("tc") for c in s)]
    assert len(mixed) == 8
    assert all(sorted({unit_of[c][0] for c in s}) == ["fm", "tf"] for s in mixed)
    # one implementation alone is dealt as before: by load
    solo = [c for c in ids if c.startswith("tf")]
    assert sorted(len({unit_of[c] for c in s}) for s in warm_shards(solo, 4, unit_of,
                                                                      backend_of)) == [2] * 4


def test_compile_units_group_the_sizes_of_one_kernel_class(tmp_path):
    from harness.registry import get_op
    from harness.store.results import cases_frame
    from harness.execute.executors.warm import compile_units
    import kernels  # noqa: F401  (registers the ops)

    exp = spec.from_dict({
        "name": "units", "op": "attention", "baseline": "naive",
        "candidates": ["triton_flash", "torch_compile"], "params": {"H": 2, "mode": "fwd"},
        "cases": [{"B": 2, "N": 64, "D": 16, "causal": False},
                  {"B": 1, "N": 128, "D": 16, "causal": False},
                  {"B": 1, "N": 128, "D": 32, "causal": False},
                  {"B": 1, "N": 128, "D": 16, "causal": True}],
        "dtypes": ["float16", "bfloat16"]})
    cases = spec.expand(exp)
    run = store.create_run(tmp_path, "units", {"experiment": exp.model_dump(mode="json"),
                                               "device": "cpu", "status": "running"})
    store.write_table(run, "cases", cases_frame(cases))
    ids = [c.case_id for c in cases if c.impl != "naive"]
    units = compile_units(run, get_op("attention"), ids)
    assert set(units) == set(ids)
    assert {units[c][1] for c in ids if c.startswith("torch_compile")} == {"compile"}
    assert {units[c][1] for c in ids if c.startswith("triton_flash")} == {"triton"}
    by_unit = {}
    for c in ids:
        by_unit.setdefault(units[c][0], []).append(c)
    # B and N are sizes (Param.size): the two non-causal D=16 shapes share a class; D, causal
    # and the dtype make classes of their own: 3 param sets x 2 dtypes x 2 impls
    assert len(by_unit) == 12
    pair = [c for c in ids if c.startswith("triton_flash") and ".D=16.causal=false" in c
            and c.endswith(".float16")]
    assert len(pair) == 2 and units[pair[0]][0] == units[pair[1]][0]


def test_compile_workers_one_per_two_cores_capped_by_gpus_and_their_memory():
    assert compile_workers(16, 100) == 8  # an H100 host: 8 workers compiled in 18.8 s, 4 in 33
    assert compile_workers(2, 100) == 1  # a small machine still compiles ahead, in one
    assert compile_workers(64, 3) == 3 and compile_workers(8, 0) == 0
    # a two-GPU host (32 cores): eight per GPU; its cores still bound it
    assert compile_workers(32, 100, 2) == 16 and compile_workers(16, 100, 2) == 8
    assert compile_workers(64, 100, 1) == 8
    # one worker per 9 GiB of a GPU: an 80 GB card holds 8, a 40 GB one 4, a 24 GB one 2
    assert compile_workers(16, 100, 1, 81559.0) == 8
    assert compile_workers(16, 100, 1, 40960) == 4 and compile_workers(64, 100, 2, 24576) == 4
    assert compile_workers(16, 100, 1, 4096) == 1  # even a small card compiles ahead
    assert compile_workers(16, 100, 1, "[N/A]") == 8  # unknown memory: cores and GPUs decide
    from harness.execute.executors.schedule import workers_per_gpu

    assert workers_per_gpu(8, 2) == 4 and workers_per_gpu(5, 2) == 3
    assert workers_per_gpu(3, 1) == 3 and workers_per_gpu(0, 2) == 0


class _Timed(Tuner):
    def __init__(self):
        super().__init__("t.compile_only", ("a",), configs=[(1,), (2,), (3,)])
        self.launched, self.measured = [], []

    def timing_enabled(self):
        return True

    def precompile_enabled(self):
        return True

    def measure(self, launch, cfg):
        self.measured.append(cfg)
        return 1.0


def test_compile_only_compiles_every_candidate_and_times_keeps_nothing():
    t = _Timed()

    def launch(cfg):
        if cfg == (1,):
            raise RuntimeError("out of shared memory")  # does not compile: skipped
        t.launched.append(cfg)

    tuning.take_new_picks()
    with tuning.compile_only():
        assert t.pick("k", [(1,), (2,), (3,)], launch) == (2,)  # the first that launched
    assert sorted(t.launched) == [(2,), (3,)] and t.measured == []
    assert "k" not in t.best and tuning.take_new_picks() == {}
    assert not tuning.compiling_only()
    t.pick("k", [(1,), (2,), (3,)], launch)  # outside the block: timed as usual
    assert t.measured and "k" in t.best


@pytest.mark.slow
def test_compile_ahead_warms_compiling_impls_in_parallel_and_survives_a_hang(
        tmp_path, test_ops, monkeypatch):
    log = tmp_path / "tune.log"
    monkeypatch.setenv("HARNESS_TEST_TUNE_LOG", str(log))
    run, ids = _run_dir(tmp_path, ["warm_tuned", "warm_hang"], n=(64, 1000, 4096))
    t64, t1000, t4096, h64 = ("warm_tuned.N=64.float32", "warm_tuned.N=1000.float32",
                              "warm_tuned.N=4096.float32", "warm_hang.N=64.float32")
    order = [t64, t1000, h64, t4096]  # dealt: [t64, h64] and [t1000, t4096]
    events = []
    out = compile_ahead(run, order, device="cpu", limits={c: 3.0 for c in ids}, gpus=[None],
                        on_event=events.append, workers=2)
    assert out["workers"] == 2 and out["cases"] == 4
    recs = {r["case_id"]: r for r in store.read_parts(run, "warm")}
    assert {c: recs[c]["status"] for c in (t64, t1000, t4096)} == dict.fromkeys(
        (t64, t1000, t4096), "ok")
    assert h64 not in recs  # killed by the watchdog: the check pass meets it and says so
    lines = [ln.split() for ln in log.read_text().splitlines()]
    assert not [ln for ln in lines if ln[1] == "measure"]  # nothing timed
    launches = [ln for ln in lines if ln[1] == "launch"]
    assert sorted(ln[2] for ln in launches) == ["1", "1", "1", "2", "2", "2", "3", "3", "3"]
    assert len({ln[0] for ln in launches}) == 2  # two processes side by side
    assert not list(Path(run).glob("tuner_picks*.json"))  # no pick left for the check pass
    assert sorted(p.name for p in (run / "parts").iterdir()) == ["warm.warm0.jsonl",
                                                                 "warm.warm1.jsonl"]
    assert {e["name"] for e in events if e["event"] == "start"} == {"warm"}
    # again: only the case without a record is left, and its watchdog ends it again
    again = compile_ahead(run, order, device="cpu", limits={c: 1.0 for c in ids}, gpus=[None],
                          on_event=events.append, workers=2)
    assert again["workers"] == 1 and again["cases"] == 1


def test_a_warm_case_out_of_memory_is_tried_once_more(tmp_path, test_ops, monkeypatch):
    log = tmp_path / "tune.log"
    monkeypatch.setenv("HARNESS_TEST_TUNE_LOG", str(log))
    run, ids = _run_dir(tmp_path, ["warm_oom"], n=(64,))
    case = "warm_oom.N=64.float32"
    out = compile_ahead(run, [case], device="cpu", limits={c: 60.0 for c in ids},
                        gpus=[None], on_event=lambda ev: None, workers=1)
    assert out["cases"] == 1
    assert [r["status"] for r in store.read_parts(run, "warm")] == ["ok"]
    assert [ln.split()[1] for ln in log.read_text().splitlines()] == ["oom", "ok"]


def test_runner_compiles_ahead_only_compiling_impls_and_only_on_a_gpu(tmp_path, test_ops,
                                                                     monkeypatch):
    from rich.console import Console
    from rich.progress import Progress

    import harness.execute.executors.warm as warm
    from harness.execute.runner import Runner, wall_line

    calls = []

    def fake(run_dir, ids, **kw):
        calls.append((ids, kw["gpus"]))
        mib.append(kw["gpu_mib"])
        return {"workers": 2, "cases": len(ids), "wall_s": 1.5}

    mib = []

    beside = []

    def fake_beside(run_dir, ids, **kw):
        beside.append((ids, kw["gpus"]))
        return {"workers": 1, "cases": len(ids), "checked": len(ids), "wall_s": 0.5}

    monkeypatch.setattr(warm, "compile_ahead", fake)
    monkeypatch.setattr(warm, "check_beside", fake_beside)
    run, ids = _run_dir(tmp_path, ["warm_tuned", "zeros"])
    r = Runner(run, Console(file=open(os.devnull, "w")))
    r.manifest = {**r.manifest, "env": {**r.manifest.get("env", {}), "gpu_memory_mib": 81559.0}}
    order = list(reversed(ids))
    with Progress(console=r.console) as progress:
        r.compile_ahead(progress, order, {})  # a CPU run: nothing to warm
        assert calls == []
        r.device = "cuda"
        r.compile_ahead(progress, order, {})
    assert calls == [([c for c in order if c.startswith("warm_tuned")], [None])]
    assert mib == [81559.0]  # the GPU's memory bounds the workers (compile_workers)
    # meanwhile the cases that compile nothing are checked beside it, in check order
    assert beside == [([c for c in order if not c.startswith("warm_tuned")], [None])]
    assert "compile" in r.pass_wall  # the phase's wall: compile-ahead and the check beside
    rec = store.load_manifest(run)["compile_ahead"]
    assert rec["workers"] == 2 and rec["checked_beside"]["checked"] == len(beside[0][0])
    assert wall_line({"check": 2.0, "compile": 1.5, "total": 4}).startswith(
        "wall: compile 1.5 s · check 2.0 s")
    run2, ids2 = _run_dir(tmp_path / "off", ["warm_tuned"], extra={"compile_ahead": False})
    r2 = Runner(run2, Console(file=open(os.devnull, "w")))
    r2.device = "cuda"
    with Progress(console=r2.console) as progress:
        r2.compile_ahead(progress, ids2, {})
    assert len(calls) == 1 and len(beside) == 1


def test_a_tuned_pick_reports_its_compile_and_timing_seconds():
    import time

    t = _Timed()
    tuning.load_picks({})  # no pick stored by an earlier test

    def launch(cfg):
        time.sleep(0.01)

    with tuning.recording() as log:
        t.pick("cost-k", [(1,), (2,), (3,)], launch)
    assert log.compile_s >= 0.01 and log.timing_s >= 0.0
    with tuning.recording() as again:  # the pick is kept: nothing compiled or timed again
        t.pick("cost-k", [(1,), (2,), (3,)], launch)
    assert again.compile_s == again.timing_s == 0.0


def test_cases_compiled_by_the_previous_run_on_this_host_are_not_warmed_again(tmp_path,
                                                                            test_ops):
    import socket
    import time

    import pandas as pd

    from harness.tuning.provenance import code_hash
    from harness.registry import registry
    from harness.execute.previous import compiled_before

    op = registry().get_op("scale2")
    env = {"device": "cpu", "hostname": socket.gethostname(), "torch": "2.x", "triton": "3.x"}
    caches = {"triton": str(tmp_path / "tc"), "inductor": str(tmp_path / "ic")}
    for d in caches.values():
        (Path(d) / "k").mkdir(parents=True)
    old, ids = _run_dir(tmp_path, ["warm_tuned"])
    store.update_manifest(old, env=env, kernel_caches=caches)
    tuned = [c for c in ids if c.startswith("warm_tuned")]
    h = code_hash(op.get_impl("warm_tuned").fn)
    store.write_table(old, "results", pd.DataFrame(
        {"case_id": tuned, "code_hash": [h, "0123456789ab"]}))  # the second: older code
    time.sleep(1.1)  # run ids are per second
    new, _ = _run_dir(tmp_path, ["warm_tuned"])
    store.update_manifest(new, env=env, kernel_caches=caches)
    impl_of = dict.fromkeys(tuned, "warm_tuned")
    assert compiled_before(new, impl_of, op) == {tuned[0]}
    # other cache folders (a cold TRITON_CACHE_DIR), or the same ones emptied: nothing cached
    store.update_manifest(new, kernel_caches={**caches, "triton": str(tmp_path / "fresh")})
    assert compiled_before(new, impl_of, op) == set()
    store.update_manifest(new, kernel_caches=caches)
    (Path(caches["inductor"]) / "k").rmdir()
    assert compiled_before(new, impl_of, op) == set()
    (Path(caches["inductor"]) / "k").mkdir()
    store.update_manifest(old, kernel_caches=None)  # a run from before folders were recorded
    assert compiled_before(new, impl_of, op) == set()
    store.update_manifest(old, kernel_caches=caches)
    # a run with other folders in between (a cold-cache run) leaves these folders as they were
    time.sleep(1.1)
    between, _ = _run_dir(tmp_path, ["warm_tuned"])
    store.update_manifest(between, env=env,
                          kernel_caches={"triton": "/elsewhere", "inductor": "/x"})
    store.write_table(between, "results", pd.DataFrame({"case_id": tuned, "code_hash": [h, h]}))
    time.sleep(1.1)
    newest, _ = _run_dir(tmp_path, ["warm_tuned"])
    store.update_manifest(newest, env=env, kernel_caches=caches)
    assert compiled_before(newest, impl_of, op) == {tuned[0]}
    store.update_manifest(new, env={**env, "triton": "3.y"})  # a new triton: nothing is cached
    assert compiled_before(new, impl_of, op) == set()
    store.update_manifest(new, env={**env, "hostname": "elsewhere"})
    assert compiled_before(new, impl_of, op) == set()


def test_ray_tasks_compile_their_jit_cases_ahead_on_a_gpu(tmp_path, test_ops, monkeypatch):
    """Ray runs get compile-ahead too, inside each task: the driver picks the unchecked cases
    of JIT-compiling impls (less those this host compiled for the previous run, with
    `--ray local` only), a task warms its share of them on its GPU before its shard, and the
    driver records what the tasks did; nothing on a CPU run or with compile_ahead off."""
    from harness.execute.executors import ray_exec, warm
    from harness.execute.executors.ray_exec import RayExecutor

    run, ids = _run_dir(tmp_path, ["warm_tuned", "zeros"])
    ex = object.__new__(RayExecutor)  # no Ray needed to choose the cases
    ex.address, ex.hosts, ex.gpus = "local", set(), set()
    ex.warmed = {"workers": 0, "cases": 0, "wall_s": 0.0}
    tuned = [c for c in ids if c.startswith("warm_tuned.")]
    assert ex.warm_ids(run, ids, "cuda") == tuned  # zeros and the torch baseline: eager
    assert ex.warm_ids(run, ids, "cpu") == []
    seen = []
    monkeypatch.setattr(warm, "compile_ahead", lambda run_dir, case_ids, **kw: seen.append(
        (case_ids, kw["gpus"], sorted(kw["units"]))) or {"workers": 1, "cases": len(case_ids),
                                                          "wall_s": 2.5})
    assert ray_exec._warm(run, tuned, "cuda", {}) == {"workers": 1, "cases": 2, "wall_s": 2.5}
    assert seen == [(tuned, [None], sorted(tuned))]  # the task's own GPU (Ray pinned it)
    assert ray_exec._warm(run, tuned, "cpu", {})["workers"] == 0 and len(seen) == 1
    assert ray_exec._warm(run, [], "cuda", {})["workers"] == 0 and len(seen) == 1
    for out in ({"workers": 1, "cases": 2, "wall_s": 2.5}, {"workers": 2, "cases": 3,
                                                           "wall_s": 4.0}):
        ex._gather(run, {"host": "h", "gpu": 0, "records": {"check": [], "time": []},
                         "warm": out, "log": ""}, run / "ray.log", lambda ev: None)
    assert store.load_manifest(run)["compile_ahead"] == {"workers": 3, "cases": 5,
                                                        "wall_s": 4.0, "in_tasks": True}
    off, off_ids = _run_dir(tmp_path / "off", ["warm_tuned"], extra={"compile_ahead": False})
    assert ex.warm_ids(off, off_ids, "cuda") == []


def test_warm_plans_give_each_worker_its_classes_then_the_others_tails():
    from harness.execute.executors.schedule import warm_plans

    unit_of = {"a1": "A", "a2": "A", "b1": "B", "c1": "C", "t1": "T", "t2": "U", "d1": "D"}
    backend_of = {"a1": "triton", "a2": "triton", "b1": "triton", "c1": "triton",
                  "t1": "compile", "t2": "compile", "d1": "triton"}
    shards = [["a1", "b1", "a2", "c1"], ["t1", "d1"], ["t2"]]
    plans = warm_plans(shards, unit_of, backend_of)
    # a class's cases together, own classes first; then the others' last classes first
    assert plans[0][:4] == ["a1", "a2", "b1", "c1"]
    # worker 0 pays no torch.compile setup: it never takes a compile class over
    assert plans[0][4:] == ["d1"]
    assert plans[1] == ["t1", "d1", "c1", "t2", "b1", "a1", "a2"]
    assert plans[2][:1] == ["t2"] and "t1" in plans[2] and plans[2].index("c1") < \
        plans[2].index("a1")


def test_an_idle_compile_ahead_worker_takes_over_the_classes_another_has_not_begun(
        tmp_path, test_ops, monkeypatch):
    import harness.execute.executors.warm as warm

    run, ids = _run_dir(tmp_path, ["warm_slow"], n=(1, 2, 3, 4))
    slow = [c for c in ids if c.startswith("warm_slow.")]
    fast = [c for c in ids if not c.startswith("warm_slow.")]
    # a cost model that got it wrong: every slow class on one worker
    monkeypatch.setattr(warm, "warm_shards", lambda ids_, n, *a: [slow, fast])
    units = {c: ((c,), "compile") for c in ids}
    out = compile_ahead(run, ids, device="cpu", limits={c: 60.0 for c in ids}, gpus=[None],
                        on_event=lambda ev: None, workers=2, units=units)
    recs = {}
    for part in ("warm0", "warm1"):
        for line in (run / "parts" / f"warm.{part}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            assert rec["case_id"] not in recs  # each class compiled by one worker only
            recs[rec["case_id"]] = part
    assert sorted(recs) == sorted(ids) and out["cases"] == len(ids)
    # the idle worker took over classes from the end of the busy one's list
    assert {recs[c] for c in slow} == {"warm0", "warm1"} and recs[slow[-1]] == "warm1"
    assert not (run / "raw" / "locks" / "warm").exists()


def test_compile_ahead_takes_the_gpus_memory_from_the_runs_env(tmp_path, test_ops, monkeypatch):
    """`run` passes its GPU's memory; `ab`, which compiles ahead into the runs it made, leaves
    it to the run's env; a Ray task passes its node's."""
    from harness.execute.executors import warm

    seen = []
    monkeypatch.setattr(warm, "compile_workers",
                        lambda cpus, n, n_gpus, gpu_mib: seen.append(gpu_mib) or 0)
    run, ids = _run_dir(tmp_path, ["warm_tuned"], n=(64,))
    store.update_manifest(run, env={"device": "cuda", "gpu_memory_mib": 40960.0})
    kw = dict(device="cpu", limits={}, gpus=[None], on_event=lambda ev: None)
    assert compile_ahead(run, ids, **kw)["workers"] == 0
    assert compile_ahead(run, ids, gpu_mib=81559.0, **kw)["workers"] == 0
    assert seen == [40960.0, 81559.0]
