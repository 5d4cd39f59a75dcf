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
    monkeypatch.setenv("HARNESS_GPU", "1")
    free = iter([1 << 30, 2 << 30, touch.CONTEXT_ROOM])
    asked = []

    def reading(index):
        asked.append(index)
        return next(free)

    monkeypatch.setattr(nvml, "free_bytes", reading)
    assert touch.room_before(str(turn), poll_s=0.01) is True
    assert asked == [1, 1, 1]  # its own GPU's memory, until there was room

    monkeypatch.setattr(nvml, "free_bytes", lambda index: 1 << 30)
    t0 = time.monotonic()
    threading.Timer(0.3, turn.write_text, args=("[]",)).start()
    assert touch.room_before(str(turn), poll_s=0.01) is False  # the turn came first
    assert time.monotonic() - t0 >= 0.25

    turn.unlink()
    monkeypatch.setattr(nvml, "free_bytes", lambda index: None)
    assert touch.room_before(str(turn)) is True  # no NVML: as before
