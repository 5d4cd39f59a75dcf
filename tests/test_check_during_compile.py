"""The check pass beside the compile phase (harness.execute.compile_phase): its workers get their
turn as the phase starts and check each case once compile-ahead has built it (sharing.AheadGate),
the checks beside compile-ahead keep their cases until they end, and nothing is timed before
the phase is over. Real CPU worker processes with the self-test op where a process runs."""
import json
import os
import subprocess
import threading
import time

import pytest

from harness import store
from harness.execute.sharing import AheadGate

from test_executors import _run_dir


def _warmed(run, case_id: str) -> None:
    store.append_part(run, "warm", {"case_id": case_id, "status": "ok"}, shard="warm0")


def _later(s: float, fn, *args) -> None:
    threading.Timer(s, fn, args).start()


def test_the_gate_gives_each_case_once_compile_ahead_or_the_checks_beside_let_it_go(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert AheadGate.open(run) is None  # no compile phase beside the check pass
    AheadGate.start(run, warm=["a", "b"], beside=["c", "e"])
    gate = AheadGate.open(run)
    gate.poll_s = 0.01
    items = [("a",), ("c",), ("b",), ("d",), ("e",)]
    walk = gate.walk(items)
    assert next(walk) == ("d",)  # neither compile-ahead's nor the checks beside's
    _later(0.3, _warmed, run, "b")
    t0 = time.monotonic()
    assert next(walk) == ("b",)  # its kernels built: its turn, ahead of `a`
    assert time.monotonic() - t0 >= 0.25
    gate.defer(("b",), "b")  # it ran out of the memory compile-ahead holds: after it
    assert gate.held("b") and gate.held("a")
    # the checks beside end: what they checked is left out, what they left comes now
    store.append_part(run, "check", {"case_id": "c", "status": "ok"}, shard="beside0")
    AheadGate.end(run, "beside")
    assert next(walk) == ("e",)
    _later(0.3, AheadGate.end, run, "warm")
    assert list(walk) == [("a",), ("b",)]
    assert gate.over() and not gate.held("a")


def test_a_waiting_process_loads_each_case_once_compile_ahead_has_built_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    AheadGate.start(run, warm=["a", "b"], beside=["c"])
    gate = AheadGate.open(run)
    gate.poll_s = 0.01
    ready = gate.loadable(["a", "c", "b", "d"])
    # not compile-ahead's: at once, the checks beside compile-ahead notwithstanding
    assert [next(ready), next(ready)] == ["c", "d"]
    _later(0.3, _warmed, run, "b")
    t0 = time.monotonic()
    assert next(ready) == "b" and time.monotonic() - t0 >= 0.25  # built: ahead of `a`
    _later(0.3, AheadGate.end, run, "warm")
    assert list(ready) == ["a"]  # compile-ahead over: built or not, its to load


def test_beside_the_phase_only_torch_compile_graphs_load_the_rest_after_it(tmp_path,
                                                                         monkeypatch):
    """The time pass helper's prewarm while the compile phase runs: a torch.compile case once
    built, beside the phase (one that would time or ran out of memory there again after it);
    a Triton or library case, and an eager one never, after it."""
    from types import SimpleNamespace

    from harness.execute import prewarm

    run = tmp_path / "run"
    run.mkdir()
    AheadGate.start(run, warm=["g1", "g2", "t1"], beside=["e1"])
    gate = AheadGate.open(run)
    gate.poll_s = 0.01
    backends = {"g1": "compile", "g2": "compile", "t1": "triton", "l1": "library", "e1": "torch"}
    calls = []

    def load(worker, case, shard, emit, beside=False):
        calls.append((case[0], beside, gate.over()))
        return not (beside and case[0] == "g2")  # g2 ran out of memory beside the phase

    monkeypatch.setattr(prewarm, "_load", load)
    worker = SimpleNamespace(cases=[(c, c, None, None) for c in backends])
    _warmed(run, "g2")
    _later(0.3, _warmed, run, "g1")
    _later(0.6, AheadGate.end, run, "warm")
    _later(0.7, AheadGate.end, run, "beside")
    prewarm.prewarm(worker, None, None, lambda *a, **k: None, backends.get, gate)
    assert calls == [("g2", True, False), ("g1", True, False),  # beside, each once built
                     ("g2", False, True), ("l1", False, True), ("t1", False, True)]


def test_a_check_waits_for_compile_ahead_if_it_would_time_or_for_the_phase_if_out_of_memory(
        tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    AheadGate.start(run, warm=["a"], beside=["b"])
    gate = AheadGate.open(run)
    oom = {"status": "error", "error": "OutOfMemoryError: CUDA out of memory. Tried to "
                                       "allocate 2.00 GiB"}
    timed = {"status": "error", "error": "TimingDeferred: timing held off while ..."}
    assert gate.held_back(oom) == "" and gate.held_back(timed) == "warm"
    assert gate.held_back({"status": "error", "error": "RuntimeError: CUDA error: "
                                                       "CUBLAS_STATUS_ALLOC_FAILED when ..."}) == ""
    assert gate.held_back({**oom, "context_dead": True}) is None
    assert gate.held_back({"status": "error", "error": "ValueError: bad"}) is None
    assert gate.held_back({"status": "failed", "error": None}) is None
    AheadGate.end(run, "warm")
    # held off while compile-ahead's last workers ran: once more, now that nothing holds it
    assert gate.held_back(timed) == "warm"
    gate.defer(("t",), "t", "warm")
    assert not gate.held("t")
    assert gate.held_back(oom) == ""  # the checks beside still hold memory
    gate.defer(("x",), "x", "")
    assert gate.held("x")
    AheadGate.end(run, "beside")
    assert gate.held_back(oom) == "" and not gate.held("x")  # begun beside: once more, after
    AheadGate.start(run, warm=["a"], beside=[])  # a new phase: the ends are cleared
    assert not AheadGate.open(run).over("warm")


def test_timing_held_off_raises_before_it_takes_or_times_anything(tmp_path, monkeypatch):
    from harness.tuning import gpu_lock

    for lock in (None, str(tmp_path / "locks" / "gpu0")):
        if lock:
            monkeypatch.setenv(gpu_lock.ENV, lock)
        with gpu_lock.held_off():
            with pytest.raises(gpu_lock.TimingDeferred):
                with gpu_lock.exclusive():
                    pass
            with pytest.raises(gpu_lock.TimingDeferred):
                with gpu_lock.try_exclusive():
                    pass
            with gpu_lock.shared():  # untimed work goes on
                pass
        with gpu_lock.exclusive():  # outside the block, as before
            with gpu_lock.held_off(), gpu_lock.exclusive():  # nested in a held one: runs
                pass


def test_an_exclusive_block_inside_a_shared_one_runs_without_upgrading(tmp_path, monkeypatch):
    from harness.tuning import gpu_lock

    monkeypatch.setenv(gpu_lock.ENV, str(tmp_path / "locks" / "gpu0"))
    import fcntl

    (tmp_path / "locks").mkdir()
    other = os.open(str(tmp_path / "locks" / "gpu0.gpu"), os.O_RDWR | os.O_CREAT)
    done = threading.Event()

    def beside():  # a check beside compile-ahead whose case times a Tuner
        with gpu_lock.shared(), gpu_lock.exclusive():
            done.set()

    try:
        fcntl.flock(other, fcntl.LOCK_SH)  # another sharer: an upgrade would wait for it
        threading.Thread(target=beside, daemon=True).start()
        assert done.wait(10)
    finally:
        os.close(other)


def _worker(run, env: dict | None = None):
    """A real check + time worker process on the CPU; its events, `checked()`, `until()`."""
    from harness.execute.executors.process import worker_argv, worker_env

    events: list[dict] = []
    proc = subprocess.Popen(worker_argv(run, "check,time", "cpu"),
                            env={**worker_env("cpu"), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def pump():
        for line in proc.stdout:
            if line.startswith("@@harness "):
                events.append(json.loads(line[len("@@harness "):]))

    threading.Thread(target=pump, daemon=True).start()

    def until(cond, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert proc.poll() is None or cond(), f"the worker ended before {what}"
            assert time.monotonic() < deadline, f"never: {what}"
            time.sleep(0.05)

    until(lambda: any(e.get("event") == "pass" and e.get("name") == "check" for e in events),
          "its check pass began")
    return proc, events, until


def _checked(run) -> list[str]:
    return [r["case_id"] for r in store.read_parts(run, "check")]


@pytest.mark.slow
def test_a_check_worker_turned_during_the_compile_phase_waits_for_each_case(tmp_path, test_ops):
    run, ids = _run_dir(tmp_path, ["warm_tuned", "zeros"])
    tuned = [c for c in ids if c.startswith("warm_tuned")]  # its check times a Tuner
    plain = "zeros.N=64.float32"  # compile-ahead's here too: its check times nothing
    beside = [c for c in ids if c not in tuned and c != plain]
    AheadGate.start(run, warm=[*tuned, plain], beside=beside)
    proc, events, until = _worker(run)
    time.sleep(1.0)
    assert _checked(run) == []  # every case is compile-ahead's or the checks beside's yet
    _warmed(run, plain)
    until(lambda: plain in _checked(run), "the warmed case's check")
    # built but it would time its Tuner beside compile-ahead: again once that is over
    _warmed(run, tuned[0])
    until(lambda: any(e.get("case_id") == tuned[0] and e.get("status") == "deferred"
                      for e in events), "the timing case deferred")
    assert _checked(run) == [plain]
    # the checks beside end, having checked one case: the worker checks the others only
    store.append_part(run, "check", {"case_id": beside[0], "status": "ok"}, shard="beside0")
    AheadGate.end(run, "beside")
    until(lambda: set(beside) <= set(_checked(run)), "the cases beside left")
    assert set(_checked(run)) == {plain, *beside}
    AheadGate.end(run, "warm")
    assert proc.wait(timeout=120) == 0
    recs = {r["case_id"]: r for r in store.read_parts(run, "check") if "wall_s" in r}
    assert beside[0] not in recs and sorted(recs) == sorted(set(ids) - {beside[0]})
    assert {recs[c]["status"] for c in tuned} == {"ok"}  # timed once it could be, not failed
    assert {r["case_id"] for r in store.read_parts(run, "time")} == set(ids)


@pytest.mark.slow
def test_a_check_held_off_as_compile_ahead_ends_is_checked_again(tmp_path, test_ops):
    """A check begun while compile-ahead ran, held off (TimingDeferred) while its last
    workers ended: checked again, not recorded as an error (which left the case untimed)."""
    run, ids = _run_dir(tmp_path, ["warm_ends"])
    case = next(c for c in ids if c.startswith("warm_ends."))
    gate = AheadGate.start(run, warm=[case], beside=[c for c in ids if c != case])
    AheadGate.end(run, "beside")
    _warmed(run, case)
    proc, events, until = _worker(run, {"HARNESS_TEST_WARM_OVER": str(gate / "warm.over")})
    assert proc.wait(timeout=120) == 0
    recs = [r for r in store.read_parts(run, "check") if r["case_id"] == case]
    assert [(r["status"], r["error"]) for r in recs] == [("ok", None)]
    timed = {r["case_id"]: r["status"] for r in store.read_parts(run, "time")}
    assert timed[case] == "ok" and set(timed) == set(ids)


@pytest.mark.slow
def test_nothing_is_timed_before_the_compile_phase_ends(tmp_path, test_ops):
    run, ids = _run_dir(tmp_path, ["zeros"])
    warm = [c for c in ids if c.startswith("zeros")]
    AheadGate.start(run, warm=warm, beside=[c for c in ids if c not in warm])
    proc, events, until = _worker(run)
    for c in warm:
        _warmed(run, c)
    AheadGate.end(run, "beside")
    until(lambda: len(set(_checked(run))) == len(ids), "every check")
    time.sleep(1.0)
    assert not store.read_parts(run, "time")  # checked, but compile-ahead still runs
    AheadGate.end(run, "warm")
    assert proc.wait(timeout=120) == 0
    assert {r["case_id"] for r in store.read_parts(run, "time")} == set(ids)


@pytest.mark.slow
def test_the_time_pass_helper_loads_what_compile_ahead_built_while_the_phase_runs(
        tmp_path, test_ops):
    """The time pass's later process, started as the phase starts (`--prewarm --wait-for`):
    its first calls load each case once compile-ahead has built it, before the phase ends,
    so that they do not hold the GPU while the check pass's Tuners time; one not built yet
    waits for compile-ahead's end; nothing is timed before its turn."""
    from harness.execute.executors.process import worker_argv, worker_env

    log = tmp_path / "tune.log"
    run, ids = _run_dir(tmp_path, ["warm_tuned"], n=(64, 128))
    tuned = [c for c in ids if c.startswith("warm_tuned.")]
    assert len(tuned) == 2
    AheadGate.start(run, warm=tuned, beside=[c for c in ids if c not in tuned])
    go = tmp_path / "go.json"
    env = {**worker_env("cpu"), "HARNESS_TEST_TUNE_LOG": str(log), "TRITON_INTERPRET": "1"}
    proc = subprocess.Popen(worker_argv(run, "time", "cpu", ids, tag="time_p2")
                            + ["--prewarm", "--wait-for", str(go)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def loaded() -> list[str]:
        return [r["case_id"] for r in store.read_parts(run, "load")]

    def until(cond, what: str) -> None:
        deadline = time.monotonic() + 120
        while not cond():
            assert proc.poll() is None, f"the worker ended before {what}"
            assert time.monotonic() < deadline, f"never: {what}"
            time.sleep(0.05)

    try:
        time.sleep(3.0)
        assert loaded() == []  # nothing built yet
        _warmed(run, tuned[1])
        until(lambda: loaded() == [tuned[1]], "the built case's load")
        time.sleep(1.0)
        assert loaded() == [tuned[1]]  # the other is not built: compile-ahead still runs
        AheadGate.end(run, "warm")
        until(lambda: sorted(loaded()) == sorted(tuned), "the other case's load")
        assert not store.read_parts(run, "time_p2") and " measure " not in log.read_text()
        AheadGate.end(run, "beside")
        go.write_text(json.dumps(tuned))
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sorted(r["case_id"] for r in store.read_parts(run, "time_p2")) == sorted(tuned)
    assert all(r["status"] == "ok" for r in store.read_parts(run, "load"))


def test_the_compile_phase_opens_the_gate_and_says_when_each_part_ends(tmp_path, test_ops,
                                                                       monkeypatch):
    from rich.console import Console
    from rich.progress import Progress

    from harness.execute.compile_phase import CompilePhase
    from harness.execute.executors import warm
    from harness.execute.runner import Runner

    seen = {}

    def fake(run_dir, ids, **kw):  # compile-ahead: the gate is open, it has not ended
        gate = AheadGate.open(run_dir)
        seen["warm"] = gate and (sorted(gate.warm), gate.over("warm"))
        return {"workers": 2, "cases": len(ids), "wall_s": 0.1}

    def fake_beside(run_dir, ids, **kw):
        gate = AheadGate.open(run_dir)
        seen["beside"] = gate and sorted(gate.beside)
        return {"workers": 1, "cases": len(ids), "checked": len(ids), "wall_s": 0.1}

    monkeypatch.setattr(warm, "compile_ahead", fake)
    monkeypatch.setattr(warm, "check_beside", fake_beside)
    monkeypatch.setenv("HARNESS_EARLY_CHECK", "0")
    run, ids = _run_dir(tmp_path, ["warm_tuned", "zeros"])
    r = Runner(run, Console(file=open(os.devnull, "w")))
    r.device = "cuda"
    compiled = sorted(c for c in ids if c.startswith("warm_tuned"))
    with Progress(console=r.console) as progress:
        phase = CompilePhase(r, progress, ids, {})
        assert phase.start(overlap=True)
        phase.join()
    assert seen == {"warm": (compiled, False), "beside": sorted(set(ids) - set(compiled))}
    gate = AheadGate.open(run)
    assert gate.over("warm") and gate.over("beside")
    assert store.load_manifest(run)["compile_ahead"]["check_during"] is True
    assert "compile" in r.pass_wall
    # without overlap (HARNESS_CHECK_DURING_COMPILE=0, or `compile_ahead`) no gate is opened
    run2, ids2 = _run_dir(tmp_path / "seq", ["warm_tuned", "zeros"])
    r2 = Runner(run2, Console(file=open(os.devnull, "w")))
    r2.device = "cuda"
    with Progress(console=r2.console) as progress:
        r2.compile_ahead(progress, ids2, {})
    assert seen == {"warm": None, "beside": None} and AheadGate.open(run2) is None
    assert "check_during" not in store.load_manifest(run2)["compile_ahead"]


@pytest.mark.slow
def test_a_gate_left_by_a_killed_driver_holds_no_later_run_of_the_run(tmp_path, test_ops):
    from rich.console import Console
    from rich.progress import Progress

    from harness.execute.runner import Runner

    run, ids = _run_dir(tmp_path, ["zeros"])
    AheadGate.start(run, warm=list(ids), beside=[])  # no end: its driver was killed
    r = Runner(run, Console(file=open(os.devnull, "w")))
    done = threading.Event()

    def measure():
        with Progress(console=r.console) as progress:
            r.measure(progress)
        done.set()

    threading.Thread(target=measure, daemon=True).start()
    assert done.wait(120), "the check worker waited for a compile phase that never ends"
    assert {x["case_id"] for x in store.read_parts(run, "check")} == set(ids)


@pytest.mark.parametrize("overlap", [True, False])
def test_the_runner_starts_the_check_pass_with_the_compile_phase(tmp_path, test_ops,
                                                                 monkeypatch, overlap):
    from rich.console import Console
    from rich.progress import Progress

    from harness.execute.executors import warm
    from harness.execute.executors.local import LocalExecutor
    from harness.execute.runner import Runner

    measured, seen = threading.Event(), {}

    def fake(run_dir, ids, **kw):  # compile-ahead: does the check pass start meanwhile?
        seen["measured during the phase"] = measured.wait(10 if overlap else 0.5)
        return {"workers": 2, "cases": len(ids), "wall_s": 0.1}

    class Measure(LocalExecutor):
        def measure(self, run_dir, case_ids, cost, limits, device, on_event):
            gate = AheadGate.open(run_dir)
            seen["gate"] = gate is not None and not gate.over("warm")
            measured.set()

    monkeypatch.setattr(warm, "compile_ahead", fake)
    monkeypatch.setattr(warm, "check_beside", lambda run_dir, ids, **kw: None)
    monkeypatch.setenv("HARNESS_EARLY_CHECK", "0")
    monkeypatch.setenv("HARNESS_CHECK_DURING_COMPILE", "1" if overlap else "0")
    run, ids = _run_dir(tmp_path, ["warm_tuned", "zeros"])
    r = Runner(run, Console(file=open(os.devnull, "w")), Measure())
    r.device = "cuda"
    with Progress(console=r.console) as progress:
        r.measure(progress)
    assert seen == {"measured during the phase": overlap, "gate": overlap}
    assert not (run / "raw" / "locks" / "ahead").exists()  # the gate goes with the passes
    assert ("check_during" in store.load_manifest(run)["compile_ahead"]) == overlap
