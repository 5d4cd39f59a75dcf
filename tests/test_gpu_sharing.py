"""One GPU shared by a run's processes without disturbing a measurement: the reader-writer GPU
lock (harness.tuning.gpu_lock), the check of cases that compile nothing beside compile-ahead
(warm.check_beside), the time pass's second process loading its cases while the first checks
(process.Helper: `--prewarm`, `--wait-for`), and a check out of memory tried once more with the
GPU to itself. Real worker processes on the CPU with the self-test op."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness import store
from harness.execute.executors.warm import check_beside, check_beside_cases
from harness.execute.worker_main import main as worker_main
from harness.execute.sharing import out_of_memory

from test_executors import _run_dir

ROOT = Path(__file__).resolve().parent.parent

HOLDER = """
import os, sys, time
from harness.tuning import gpu_lock
kind, hold, log = sys.argv[1], float(sys.argv[2]), sys.argv[3]
block = gpu_lock.exclusive if kind == "ex" else gpu_lock.shared
for i in range(int(sys.argv[4]) if len(sys.argv) > 4 else 1):
    with block():
        with open(log, "a") as f:
            f.write(f"{kind}{os.getpid()} {i} in {time.monotonic()}\\n")
        time.sleep(hold)
        with open(log, "a") as f:
            f.write(f"{kind}{os.getpid()} {i} out {time.monotonic()}\\n")
"""


def _holder(tmp_path, kind, hold, n=1, lock=True):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if lock:
        env["HARNESS_GPU_LOCK"] = str(tmp_path / "locks" / "gpu0")
    else:
        env.pop("HARNESS_GPU_LOCK", None)
    return subprocess.Popen([sys.executable, "-c", HOLDER, kind, str(hold),
                             str(tmp_path / "log"), str(n)], env=env)


def _spans(tmp_path):
    """{(kind + pid, i): (in, out)} from the holders' log."""
    spans: dict = {}
    for line in (tmp_path / "log").read_text().splitlines():
        kind, i, what, t = line.split()
        spans.setdefault((kind, int(i)), [None, None])[what == "out"] = float(t)
    return spans


def _overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_exclusive_and_shared_never_overlap_and_a_timer_is_not_starved(tmp_path):
    # a process looping over untimed calls back to back, and a timer arriving meanwhile: the
    # timer gets the GPU at the next gap, and no untimed call overlaps its block
    reader = _holder(tmp_path, "sh", 0.15, n=8)
    time.sleep(0.5)
    writer = _holder(tmp_path, "ex", 0.3)
    assert writer.wait(timeout=60) == 0 and reader.wait(timeout=60) == 0
    spans = _spans(tmp_path)
    (ex,) = [v for k, v in spans.items() if k[0].startswith("ex")]
    shared = [v for k, v in spans.items() if k[0].startswith("sh")]
    assert len(shared) == 8 and not any(_overlap(ex, s) for s in shared)
    # the timer went in before the reader's loop was over (the gate: no starvation)
    assert any(s[0] > ex[1] for s in shared), spans


def test_two_untimed_holders_share_and_no_lock_means_no_waiting(tmp_path):
    a, b = _holder(tmp_path, "sh", 0.5), _holder(tmp_path, "sh", 0.5)
    assert a.wait(timeout=60) == 0 and b.wait(timeout=60) == 0
    sh = [v for k, v in _spans(tmp_path).items()]
    assert len(sh) == 2 and _overlap(*sh)  # side by side: they only keep timers away
    (tmp_path / "log").unlink()
    a, b = _holder(tmp_path, "ex", 0.5, lock=False), _holder(tmp_path, "ex", 0.5, lock=False)
    assert a.wait(timeout=60) == 0 and b.wait(timeout=60) == 0
    assert _overlap(*_spans(tmp_path).values())  # unset: no locking at all


def test_nested_exclusive_blocks_take_the_lock_once(tmp_path, monkeypatch):
    from harness.tuning import gpu_lock

    monkeypatch.setenv(gpu_lock.ENV, str(tmp_path / "locks" / "gpu0"))
    with gpu_lock.exclusive():
        with gpu_lock.exclusive():  # a Tuner timing inside the time pass
            pass
        with gpu_lock.shared():  # untimed work of the timer itself: no self-deadlock
            pass
        # still held: another process's untimed call waits
        p = _holder(tmp_path, "sh", 0.0)
        time.sleep(0.5)
        assert p.poll() is None
    assert p.wait(timeout=60) == 0


def test_the_time_a_timer_waited_for_the_gpu_is_counted(tmp_path, monkeypatch):
    """A Tuner's evidence says how much of its timing was waiting for the lock (wait_s)."""
    from harness.tuning import gpu_lock

    monkeypatch.setenv(gpu_lock.ENV, str(tmp_path / "locks" / "gpu0"))
    p = _holder(tmp_path, "sh", 1.0)
    deadline = time.monotonic() + 60
    while not (tmp_path / "log").exists():  # the untimed call holds the GPU
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.02)
    before = gpu_lock.waited_s()
    with gpu_lock.exclusive():
        pass
    assert p.wait(timeout=60) == 0
    assert 0.5 < gpu_lock.waited_s() - before < 30


def test_out_of_memory_is_recognised_in_torchs_and_libraries_words():
    class OutOfMemoryError(RuntimeError):
        pass

    assert out_of_memory(OutOfMemoryError("x"))
    assert out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert out_of_memory(RuntimeError("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))
    assert not out_of_memory(ValueError("shapes do not match"))


def test_check_beside_keeps_results_and_leaves_faults_and_timings_to_the_check_pass(tmp_path,
                                                                                    test_ops):
    from harness.registry import registry

    run, ids = _run_dir(tmp_path, ["zeros", "raises", "tuned", "warm_tuned", "segfault"],
                        n=(64,))
    op = registry().get_op("scale2")
    # cases that compile something (backend compile/triton) are compile-ahead's, not its own
    plain = check_beside_cases(run, op, ids)
    assert "warm_tuned.N=64.float32" not in plain and "segfault.N=64.float32" == plain[-1]
    events = []
    out = check_beside(run, plain, device="cpu", limits={c: 120.0 for c in ids},
                       gpus=[None], on_event=events.append)
    recs = {r["case_id"]: r for r in store.read_parts(run, "check")}
    # a correct and an incorrect result are kept; an exception, a Tuner's timing (timed beside
    # other work) and a dead worker's case are not: the check pass does them alone
    assert recs["torch.N=64.float32"]["status"] == "ok"
    assert recs["zeros.N=64.float32"]["status"] == "failed"
    assert set(recs) == {"torch.N=64.float32", "zeros.N=64.float32"}
    assert out["workers"] == 1 and out["cases"] == 5 and out["checked"] == 2
    assert {e["case_id"] for e in events if e.get("status") == "deferred"} == {
        "raises.N=64.float32", "tuned.N=64.float32"}
    assert store.load_tuner_picks(run) == {}  # the pick timed beside compile-ahead is dropped
    assert sorted(p.name for p in (run / "parts").iterdir()) == ["check.beside0.jsonl"]


def test_check_beside_lanes_claim_whole_shapes(tmp_path, test_ops):
    """Eight shapes, two lanes on the one GPU: each lane walks every case and checks a shape
    only if it claims it first, so every case is checked once and a shape's implementations
    in one lane (their inputs and references are computed once, in one process)."""
    sizes = (64, 96, 128, 160, 192, 224, 256, 288)
    run, ids = _run_dir(tmp_path, ["torch", "zeros"], n=sizes)
    out = check_beside(run, ids, device="cpu", limits={c: 120.0 for c in ids}, gpus=[None],
                       on_event=lambda ev: None)
    assert out["workers"] == 2 and out["checked"] == len(ids)
    lane_of: dict[str, list[str]] = {}
    for p in (run / "parts").iterdir():
        assert p.name in ("check.beside0.jsonl", "check.beside1.jsonl")
        for r in map(json.loads, p.read_text().splitlines()):
            lane_of.setdefault(r["case_id"].split(".")[1], []).append(p.name)
    assert sorted(lane_of) == sorted(f"N={n}" for n in sizes)
    assert all(len(lanes) == 2 and lanes[0] == lanes[1] for lanes in lane_of.values())
    assert not (run / "raw" / "locks" / "beside").exists()  # the claims are cleared


def test_check_beside_starts_one_lane_for_one_case(tmp_path, test_ops):
    run, ids = _run_dir(tmp_path, ["torch"], n=(64,))
    out = check_beside(run, ids, device="cpu", limits={c: 120.0 for c in ids}, gpus=[None],
                       on_event=lambda ev: None)
    assert out["workers"] == 1 and out["checked"] == 1


def test_a_check_out_of_memory_is_tried_again_alone_only_where_the_gpu_is_shared(
        tmp_path, test_ops, monkeypatch):
    run, ids = _run_dir(tmp_path, ["warm_oom"], n=(64,))
    case = "warm_oom.N=64.float32"
    args = ["--run", str(run), "--passes", "check", "--device", "cpu", "--cases", case]
    monkeypatch.delenv("HARNESS_GPU_LOCK", raising=False)
    import harness_test_ops

    monkeypatch.setattr(harness_test_ops, "_OOM_SEEN", [])
    assert worker_main(args) == 0
    (rec,) = store.read_parts(run, "check")
    assert rec["status"] == "error" and "out of memory" in rec["error"]
    store.clear_parts(run, "check")
    monkeypatch.setattr(harness_test_ops, "_OOM_SEEN", [])
    monkeypatch.setenv("HARNESS_GPU_LOCK", str(tmp_path / "locks" / "gpu0"))
    assert worker_main(args) == 0
    (rec,) = store.read_parts(run, "check")
    assert rec["status"] == "ok"


def test_prewarm_calls_every_case_untimed_then_waits_for_its_turn(tmp_path, test_ops):
    log = tmp_path / "tune.log"
    run, ids = _run_dir(tmp_path, ["warm_tuned"], n=(64,))
    go = tmp_path / "go.json"
    env = {**os.environ, "HARNESS_TEST_TUNE_LOG": str(log), "TRITON_INTERPRET": "1"}
    argv = [sys.executable, "-m", "harness", "worker", "--run", str(run), "--passes", "time",
            "--device", "cpu", "--cases", ",".join(ids), "--tag", "time_p2", "--prewarm",
            "--wait-for", str(go)]
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not log.exists() or "launch 3" not in log.read_text():
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.1)
    time.sleep(0.5)
    assert p.poll() is None  # waiting for its turn, no timing recorded yet (its loads only)
    assert {f.name for f in (run / "parts").iterdir()} <= {"load.jsonl"}
    lines = log.read_text().split("\n")
    assert not any(" measure " in ln for ln in lines)  # compiled (launched), never timed
    assert store.load_tuner_picks(run) == {}
    go.write_text(json.dumps(["warm_tuned.N=64.float32"]))
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0
    recs = store.read_parts(run, "time_p2")
    assert [(r["case_id"], r["status"]) for r in recs] == [("warm_tuned.N=64.float32", "ok")]
    ev = [json.loads(ln[len("@@harness "):]) for ln in out.splitlines()
          if ln.startswith("@@harness ")]
    # the cases that load something on their first call (here backend compile), not the
    # eager torch baseline's: calling those would only take the GPU from the first process
    warmed = [e["case_id"] for e in ev if e["event"] == "start" and e["name"] == "prewarm"]
    assert warmed == [c for c in ids if c.startswith("warm_tuned.")] and len(warmed) < len(ids)
    loads = store.read_parts(run, "load")  # what each first call cost this fresh process
    assert sorted(r["case_id"] for r in loads) == sorted(warmed)
    assert all(r["status"] == "ok" and r["load_s"] > 0 for r in loads)


def test_prewarm_waits_for_its_load_file_first(tmp_path, test_ops):
    """`--load-after`: a profiler process started while the time pass times makes no call
    until that file exists, then prewarms and waits for its turn as before."""
    log = tmp_path / "tune.log"
    run, ids = _run_dir(tmp_path, ["warm_tuned"], n=(64,))
    load, go = tmp_path / "load.json", tmp_path / "go.json"
    env = {**os.environ, "HARNESS_TEST_TUNE_LOG": str(log), "TRITON_INTERPRET": "1"}
    argv = [sys.executable, "-m", "harness", "worker", "--run", str(run), "--passes", "time",
            "--device", "cpu", "--cases", ",".join(ids), "--tag", "time_p2", "--load-after",
            str(load), "--prewarm", "--wait-for", str(go)]
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    time.sleep(6.0)  # started, imported: waiting for the load file
    assert p.poll() is None and not log.exists()
    load.write_text("[]")
    deadline = time.monotonic() + 120
    while not log.exists() or "launch 3" not in log.read_text():  # prewarmed now
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.1)
    assert not store.read_parts(run, "time_p2")  # and waits for its turn
    go.write_text(json.dumps(["warm_tuned.N=64.float32"]))
    p.communicate(timeout=120)
    assert p.returncode == 0
    assert [r["case_id"] for r in store.read_parts(run, "time_p2")] == ["warm_tuned.N=64.float32"]


def test_a_profiled_call_has_the_gpu_to_itself_while_the_next_pass_prewarms(tmp_path,
                                                                           monkeypatch,
                                                                           test_ops):
    """The next profiler process makes its first calls while the current one profiles
    (ProfilerPasses._run_in_turn): the profiled call, inside its NVTX range, holds the GPU
    lock exclusively, so none of those calls (shared) overlaps it; the warm-up calls before
    the range take no lock."""
    from harness.execute.worker import Worker
    from harness.tuning import gpu_lock

    monkeypatch.setenv(gpu_lock.ENV, str(tmp_path / "locks" / "gpu0"))
    run, ids = _run_dir(tmp_path, ["zeros"], n=(64,))
    w = Worker(run, "cpu")
    (case,) = [c for c in w.cases if c[0] == ids[0]]
    case_id, impl_name, params, dtype = case
    reader = _holder(tmp_path, "sh", 0.1, n=30)  # untimed first calls, back to back
    deadline = time.monotonic() + 60
    while not (tmp_path / "log").exists():
        assert time.monotonic() < deadline and reader.poll() is None
        time.sleep(0.02)
    spans = []

    def inside(fn):
        t0 = time.monotonic()
        fn()
        time.sleep(0.3)
        spans.append((t0, time.monotonic()))

    for _ in range(2):
        w._warm_then_range(w.op.get_impl(impl_name), params, dtype, case_id, inside)
    assert reader.wait(timeout=120) == 0
    shared = [v for k, v in _spans(tmp_path).items() if k[0].startswith("sh")]
    assert len(spans) == 2 and len(shared) == 30
    assert not any(_overlap(r, s) for r in spans for s in shared), (spans, shared)
    # the reader went on between and after the two ranges: shared, not shut out
    assert any(s[0] > spans[0][1] for s in shared)


def test_a_two_process_run_lets_the_second_process_prewarm_and_take_its_turn(tmp_path):
    """The whole path through the CLI: the time pass's second process is the Helper (its log
    shows the prewarm and the turn file), and the run's records are complete."""
    exp = tmp_path / "e.yaml"
    exp.write_text("name: procs\nop: scale2\nbaseline: torch\ncandidates: [tuned]\n"
                   "sweep: {N: [64, 1000]}\ndtypes: [float32]\n"
                   "timing: {processes: 2, rep_ms: 5, min_samples: 3}\n")
    env = {**os.environ, "HARNESS_OPS": "harness_test_ops",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    p = subprocess.run([sys.executable, "-m", "harness", "run", str(exp), "--store",
                        str(tmp_path / "runs")], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    (run,) = [d for d in (tmp_path / "runs").iterdir() if (d / "manifest.json").exists()]
    helper_log = (run / "raw" / "logs" / "measure.p2.log").read_text()
    assert "--prewarm --wait-for" in helper_log and "[exit 0]" in helper_log
    assert "time_p2" not in (run / "raw" / "logs" / "measure.log").read_text()
    assert len(store.read_parts(run, "time_p2")) == 4
    assert not (run / "raw" / "locks").exists()  # the locks and the turn file are gone


def test_workers_beside_others_hand_back_cached_memory_after_each_case(tmp_path, monkeypatch):
    """A check lane beside compile-ahead and the compile-ahead workers empty torch's cache
    after each case (collect=False: no full garbage collection): on an H100, a lane that kept
    37 GiB cached after naive attention's backward left 0.24 GiB free to the workers. A
    check pass alone keeps its cache."""
    from harness import store, tuning
    from harness.execute.worker import EXIT_CONTEXT_DEAD, Worker
    from harness.experiment import spec as spec_mod
    from harness.store.results import cases_frame

    exp = spec_mod.from_dict({"name": "lane", "op": "softmax", "baseline": "torch",
                              "sweep": {"M": [4], "N": [64, 128]}, "dtypes": ["float32"]})
    cases = spec_mod.expand(exp)
    released = {}
    for name, ahead in (("lane", True), ("alone", False)):
        run = store.create_run(tmp_path / name, "lane", {
            "experiment": exp.model_dump(mode="json"), "device": "cpu", "seed": 1,
            "status": "running", "passes": {}, "env": {"device": "cpu"}})
        store.write_table(run, "cases", cases_frame(cases))
        w = Worker(run, "cpu")
        # a pick timed before the loop (here: an earlier test in this process) is no case's:
        # it had made the lane's first case 'deferred' in CI
        tuning.remember("stale_tuner", (1,), {"BLOCK": 1}, "timed")
        calls = released[name] = []
        monkeypatch.setattr(w, "_release", lambda collect=True, calls=calls: calls.append(collect))
        assert w.run(["check"], None, shard="beside0" if ahead else None, ahead=ahead) == 0
        assert len(store.read_parts(run, "check")) == len(cases)
        if ahead:  # a compile-ahead worker too, and none after a case that killed the context
            assert w.run(["warm"], None, shard="warm0") == 0
            assert len(calls) == 2 * len(cases)
            monkeypatch.setattr(w, "_one", lambda *a: {"status": "error", "error": "dead",
                                                       "context_dead": True})
            assert w.run(["check"], None, tag="again", ahead=True) == EXIT_CONTEXT_DEAD
            assert len(calls) == 2 * len(cases)
    assert released["lane"] == [False] * (2 * len(cases)) and released["alone"] == []


def test_a_worker_ahead_of_its_turn_sets_up_first_and_says_when_its_cases_are_over(
        tmp_path, monkeypatch, test_ops, capsys):
    """A worker started ahead of its turn (`wait_for`) first sets up what launches no kernel
    (harness.execute.touch) for its cases' backends; a profiler worker says `end` once its
    last case is done, after the `done` of every case (the next process's turn, while the
    profiler writes its report). A worker not ahead of its turn sets nothing up."""
    from harness.execute import worker as worker_mod
    from harness.execute.worker import Worker

    run, ids = _run_dir(tmp_path, ["zeros", "warm_tuned"], n=(64,))
    seen = []
    monkeypatch.setattr(worker_mod, "touch", lambda device, backends, turn=None, gpu=None:
                        seen.append((device, backends, turn)))
    turn = tmp_path / "turn"
    turn.write_text(json.dumps(ids))
    w = Worker(run, "cpu")
    capsys.readouterr()
    assert w.run(["profile"], None, tag="fakeprof", wait_for=str(turn)) == 0
    # a profiler's worker sets CUDA up whatever the GPU's memory (turn None: no room wait)
    assert seen == [("cpu", {worker_mod.impl_backend(w.op, c[1]) for c in w.cases}, None)]
    assert seen[0][1] == {"torch", "compile"}
    events = [json.loads(line.split(" ", 1)[1]) for line in capsys.readouterr().out.splitlines()
              if line.startswith("@@harness ")]
    kinds = [e["event"] for e in events]
    assert kinds[-1] == "end" and kinds.count("end") == 1
    assert sorted(e["case_id"] for e in events if e["event"] == "done") == sorted(ids)
    seen.clear()
    assert Worker(run, "cpu").run(["check"], None) == 0
    assert seen == []
    # a check worker started beside compile-ahead (early_check) waits for room, or its turn
    assert Worker(run, "cpu").run(["check", "time"], None, wait_for=str(turn)) == 0
    assert [s[2] for s in seen] == [str(turn)]
    assert "end" not in capsys.readouterr().out  # only a profiler's worker hands a turn on


def test_whole_memory_is_one_compile_workers_at_a_time_and_gives_the_share_back(
        tmp_path, monkeypatch):
    """sharing.whole_memory: the GPU's whole memory for the block (fraction 1.0), one holder
    at a time (a second waits for the first), the cache emptied and the worker's share
    restored after each."""
    import threading

    import torch

    from harness.execute import sharing

    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda f: calls.append(("fraction", f)))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty",)))
    inside = []

    def two_holders(names, held_s, by_gpu=False):
        """Two threads 50 ms apart, each holding whole_memory for `held_s` seconds (on the
        GPU it is named for, `by_gpu`; else on the worker's own)."""
        def hold(name):
            with sharing.whole_memory(tmp_path, 0.125, gpu=name if by_gpu else None):
                inside.append((name, "in"))
                time.sleep(held_s)
                inside.append((name, "out"))

        inside.clear()
        threads = [threading.Thread(target=hold, args=(n,)) for n in names]
        for t in threads:
            t.start()
            time.sleep(0.05)
        for t in threads:
            t.join(10)

    two_holders(("a", "b"), 0.3)
    assert [k for _, k in inside] == ["in", "out", "in", "out"]  # never both inside
    assert inside[0][0] == inside[1][0] and inside[2][0] == inside[3][0]
    assert calls == [("fraction", 1.0), ("empty",), ("fraction", 0.125)] * 2
    # the workers of two GPUs do not wait for each other (held long beside the other's
    # start, on a loaded CI too)
    two_holders(("0", "1"), 1.0, by_gpu=True)
    assert [k for _, k in inside] == ["in", "in", "out", "out"]


def test_a_compile_worker_out_of_its_share_tries_again_with_the_whole_memory(
        tmp_path, monkeypatch, test_ops):
    """do_warm: a case out of memory under the worker's share (naive attention's N x N at
    N=16384 needs 8-16 GiB) is tried once more, its cache handed back, with the GPU's whole
    memory (sharing.whole_memory): beside the other workers where the GPU has room for it
    (sharing.room_for), else alone, and alone if out of memory again; a worker without a
    share tries once more as it is; a failure alone is the case's error."""
    from contextlib import contextmanager

    import pytest

    from harness.execute import sharing
    from harness.execute.worker import Worker

    class OutOfMemoryError(RuntimeError):
        pass

    run, _ = _run_dir(tmp_path, ["warm_tuned"], n=(64,))
    w = Worker(run, "cpu")
    case_id, impl_name, params, dtype = next(c for c in w.cases if c[1] == "warm_tuned")
    impl = w.op.get_impl(impl_name)
    held, tries, room = [], [], [True]

    @contextmanager
    def whole(run_dir, share, alone=True):
        held.append((share, alone))
        yield

    monkeypatch.setattr(sharing, "whole_memory", whole)
    monkeypatch.setattr(sharing, "room_for", lambda exc: room[0])

    def prepare(fails):
        def fn():
            if len(tries) < fails:
                tries.append("oom")
                raise OutOfMemoryError("CUDA out of memory")
            tries.append("ok")
        return lambda *a: (fn, 0)

    def warm(fails, share=0.125):
        tries.clear(), held.clear()
        w.warm_share = share
        monkeypatch.setattr(w, "_prepare", prepare(fails))
        return w.do_warm(impl, params, dtype, case_id)["status"]

    assert warm(1) == "ok" and tries == ["oom", "ok"] and held == [(0.125, False)]
    room[0] = False  # no room beside the others: alone at once
    assert warm(1) == "ok" and held == [(0.125, True)]
    room[0] = True  # out of memory beside the others too: alone
    assert warm(2) == "ok" and tries == ["oom", "oom", "ok"]
    assert held == [(0.125, False), (0.125, True)]
    with pytest.raises(OutOfMemoryError):
        warm(3)
    assert tries == ["oom"] * 3 and held == [(0.125, False), (0.125, True)]
    room[0] = False
    with pytest.raises(OutOfMemoryError):
        warm(2)
    assert tries == ["oom"] * 2 and held == [(0.125, True)]
    assert warm(1, share=0.0) == "ok" and tries == ["oom", "ok"] and held == []  # as it is


def test_room_for_reads_what_the_failed_allocation_asked(monkeypatch):
    import torch

    from harness.execute import sharing

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (40 * 2 ** 30, 80 * 2 ** 30))
    msg = ("CUDA out of memory. Tried to allocate {} GiB. GPU 0 has a total capacity of "
           "79.19 GiB of which 40.00 GiB is free.")
    assert sharing.room_for(RuntimeError(msg.format("16.00")))
    assert not sharing.room_for(RuntimeError(msg.format("20.50")))
    assert sharing.room_for(RuntimeError("Tried to allocate 512.00 MiB"))
    assert not sharing.room_for(RuntimeError("CUDA out of memory"))  # it does not say
