"""The check pass's first worker started while compile-ahead runs (executors.early_check): it
sets itself up and waits for its turn, run_shard hands it the cases in place of a fresh
worker, a fault it meets is recorded and a fresh worker goes on, and one not used ends.
Real worker processes on the CPU with the self-test op (the per-GPU executor with fake device
indices, as in test_executors)."""
import threading
import time

import pytest

from harness import store
from harness.execute.executors.gpus import GpuExecutor
from harness.execute.executors.local import LocalExecutor
from harness.execute.executors.schedule import longest_first

from test_executors import _run_dir

pytestmark = pytest.mark.slow


def _waiting(log, n: int = 1, timeout: float = 120) -> None:
    """Until `log` shows `n` started workers waiting for a turn (no record written yet)."""
    deadline = time.monotonic() + timeout
    while not log.exists() or log.read_text().count("--wait-for") < n:
        assert time.monotonic() < deadline, "the early worker never started"
        time.sleep(0.05)


def _workers(log) -> list[str]:
    """The command lines of the workers a measure log shows, in order."""
    return [ln for ln in log.read_text().splitlines() if ln.startswith("$ ")]


def test_the_early_worker_checks_and_times_every_case_in_its_turn(tmp_path, test_ops):
    run, ids = _run_dir(tmp_path, ["zeros", "tuned"])
    ex, limits = LocalExecutor(), {c: 60.0 for c in ids}
    ex.start_early(run, "cpu", limits)
    log = run / "raw" / "logs" / "measure.log"
    _waiting(log)
    time.sleep(1.0)  # set up and waiting: nothing done before its turn
    assert not store.read_parts(run, "check") and not store.read_parts(run, "time")
    events = []
    ex.measure(run, ids, {}, limits, "cpu", events.append)
    workers = _workers(log)
    assert len(workers) == 1 and "--wait-for" in workers[0]  # no second worker was needed
    assert "[exit 0]" in log.read_text()
    for part in ("check", "time"):
        assert sorted(r["case_id"] for r in store.read_parts(run, part)) == sorted(ids)
    checked = [e["case_id"] for e in events if e["event"] == "done" and e["name"] == "check"]
    assert sorted(checked) == sorted(ids)  # its events reached the runner
    assert ex.take_early(None) is None  # used once


def test_a_fault_in_the_early_worker_is_recorded_and_a_fresh_worker_goes_on(tmp_path,
                                                                           test_ops):
    run, ids = _run_dir(tmp_path, ["segfault"])
    cost = {c: (10.0 if c.startswith("segfault") else 1.0) for c in ids}
    order = longest_first(ids, cost)
    ex, limits = LocalExecutor(), {c: 60.0 for c in ids}
    ex.start_early(run, "cpu", limits)
    ex.measure(run, order, cost, limits, "cpu", lambda ev: None)
    check = {r["case_id"]: r for r in store.read_parts(run, "check")}
    assert sorted(check) == sorted(ids)
    dead = [c for c in ids if c.startswith("segfault")]
    assert check[dead[0]]["status"] == "error"  # the early worker's case in flight
    assert "worker died" in check[dead[0]]["error"]
    workers = _workers(run / "raw" / "logs" / "measure.log")
    # the early worker, then one fresh worker per fault: the early worker's fault was
    # recorded, not met again by a fresh worker
    assert "--wait-for" in workers[0] and len(workers) == 1 + len(dead)
    assert all(check[c]["status"] == "ok" for c in ids if c.startswith("torch"))


def test_an_early_worker_not_used_ends(tmp_path, test_ops):
    run, ids = _run_dir(tmp_path, ["zeros"])
    ex = LocalExecutor()
    ex.start_early(run, "cpu", {c: 60.0 for c in ids})
    log = run / "raw" / "logs" / "measure.log"
    _waiting(log)
    (early,) = ex._early.values()
    ex.cancel_early()
    assert not early.thread.is_alive()
    assert "[exit" in log.read_text()  # the process ended (killed while it waited)
    assert not store.read_parts(run, "check")


def test_each_gpu_shard_takes_its_own_early_worker(tmp_path, test_ops):
    run, ids = _run_dir(tmp_path, ["zeros"], n=(64, 1000, 4096))
    ex, limits = GpuExecutor([0, 1]), {c: 60.0 for c in ids}
    cost = {c: 1.0 for c in ids}
    ex.start_early(run, "cpu", limits)
    logs = run / "raw" / "logs"
    for g in (0, 1):
        _waiting(logs / f"measure.gpu{g}.log")
    ex.measure(run, longest_first(ids, cost), cost, limits, "cpu", lambda ev: None)
    for g, shard_ids in ex.plan(longest_first(ids, cost), cost, store.shapes(run)).items():
        workers = _workers(logs / f"measure.gpu{g}.log")
        assert len(workers) == 1 and "--wait-for" in workers[0] and f"gpu{g}" in workers[0]
        got = {r["case_id"]: r for r in store.read_parts(run, "time") if r["gpu"] == g}
        assert sorted(got) == sorted(shard_ids)


def test_a_gpu_with_nothing_to_do_ends_its_early_worker(tmp_path, test_ops):
    run, ids = _run_dir(tmp_path, ["zeros"], n=(64,))
    ex, limits = GpuExecutor([0, 1]), {c: 60.0 for c in ids}
    ex.start_early(run, "cpu", limits)
    early = dict(ex._early)
    ex.measure(run, ids[:1], {}, limits, "cpu", lambda ev: None)
    assert not any(e.thread.is_alive() for e in early.values())
    assert ex._early == {}
    assert [r["case_id"] for r in store.read_parts(run, "check")] == ids[:1]


def test_a_waiting_check_worker_makes_its_context_only_when_it_fits(tmp_path, monkeypatch):
    """touch.room_before: CUDA's context once the GPU has CONTEXT_ROOM free, never if the
    turn comes first (the first case then makes it), and as before where NVML cannot say."""
    from harness.execute import touch
    from harness.machine import nvml

    turn = tmp_path / "check.go"
    free = iter([1 << 30, 2 << 30, touch.CONTEXT_ROOM])
    asked = []

    def reading(index):
        asked.append(index)
        return next(free)

    monkeypatch.setattr(nvml, "free_bytes", reading)
    assert touch.room_before(str(turn), 1, poll_s=0.01) is True
    assert asked == [1, 1, 1]  # its own GPU's memory, until there was room

    monkeypatch.setattr(nvml, "free_bytes", lambda index: 1 << 30)
    t0 = time.monotonic()
    threading.Timer(0.3, turn.write_text, args=("[]",)).start()
    assert touch.room_before(str(turn), 1, poll_s=0.01) is False  # the turn came first
    assert time.monotonic() - t0 >= 0.25

    turn.unlink()
    monkeypatch.setattr(nvml, "free_bytes", lambda index: None)
    assert touch.room_before(str(turn), 1) is True  # no NVML: as before

    # not pinned (no HARNESS_GPU) and CUDA_VISIBLE_DEVICES set: which GPU NVML should read
    monkeypatch.setattr(nvml, "free_bytes", lambda index: 1 << 30)  # is unknown
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert touch.room_before(str(turn), None) is True


def test_a_waiting_worker_whose_driver_is_gone_ends(tmp_path, monkeypatch):
    """sharing.wait_turn (for the driver's own workers) and touch.room_before end the process
    (status 3) once its parent is no longer the process that started it: nobody would give it
    its turn. A worker a profiler wraps does not watch (its parent is ncu's or nsys's)."""
    import os

    from harness.execute import sharing, touch
    from harness.machine import nvml

    parents = iter([100, 100, 1])
    monkeypatch.setattr(os, "getppid", lambda: next(parents))

    def exit_(code):
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_)
    with pytest.raises(SystemExit) as e:
        sharing.wait_turn(str(tmp_path / "never.go"), poll_s=0.01, watch_parent=True)
    assert e.value.code == 3
    parents = iter([100, 1, 1])
    go = tmp_path / "go"
    threading.Timer(0.2, go.write_text, args=("[]",)).start()
    assert sharing.wait_turn(str(go), poll_s=0.01) == []  # not watching: waits for its turn
    parents = iter([100, 1])
    monkeypatch.setattr(nvml, "free_bytes", lambda index: 1 << 30)
    with pytest.raises(SystemExit):
        touch.room_before(str(tmp_path / "never.go"), 0, poll_s=0.01)


def test_ctrl_c_during_the_early_workers_turn_is_an_interrupted_run(tmp_path, monkeypatch,
                                                                    test_ops):
    """Ctrl-C while the driver waits for the early worker's turn: the worker ends and the
    runner gets Interrupted (a stored, resumable run), not a bare KeyboardInterrupt."""
    from harness.execute.executors import process
    from harness.execute.executors.process import Interrupted

    run, ids = _run_dir(tmp_path, ["zeros"])
    ex, limits = LocalExecutor(), {c: 60.0 for c in ids}
    ex.start_early(run, "cpu", limits)
    _waiting(run / "raw" / "logs" / "measure.log")
    (early,) = ex._early.values()

    def ctrl_c(thread):
        raise KeyboardInterrupt

    monkeypatch.setattr(process, "join", ctrl_c)
    with pytest.raises(Interrupted):
        ex.measure(run, ids, {}, limits, "cpu", lambda ev: None)
    assert not early.thread.is_alive()


def test_a_stopped_run_gives_the_early_worker_no_turn(tmp_path, test_ops):
    from harness.execute.executors.early_check import EarlyCheck
    from harness.execute.executors.process import Interrupted, run_shard

    run, ids = _run_dir(tmp_path, ["zeros"])
    limits = {c: 60.0 for c in ids}
    log = run / "raw" / "logs" / "measure.log"
    early = EarlyCheck(run, device="cpu", limits=limits, gpu=None, shard=None, log_path=log)
    stop = threading.Event()
    stop.set()
    with pytest.raises(Interrupted):
        run_shard(run, ids, device="cpu", limits=limits, log_path=log, on_event=lambda e: None,
                  stop=stop, early=early)
    assert not early.thread.is_alive() and not early.go_file.exists()
    assert not store.read_parts(run, "check")
