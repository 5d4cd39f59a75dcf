"""One profiler pass in flight (ProfilerPass) and the stop signal of one call's profiler
processes (CallStop), for harness.execute.profiler_passes."""
from __future__ import annotations

import threading
import time

from rich.progress import Progress


class CallStop:
    """A stop signal for one call's processes: set by its own fault or Ctrl-C (`set`), or by
    the run's (`outer`: Early.stop, the measure passes failed); only the latter is the run
    being stopped."""

    def __init__(self, outer: threading.Event | None) -> None:
        self.outer, self.own = outer, threading.Event()

    def is_set(self) -> bool:
        return self.own.is_set() or (self.outer is not None and self.outer.is_set())

    def set(self) -> None:
        self.own.set()


class ProfilerPass:
    """One profiler pass in flight: its cases, shards, per-case seconds and process outcomes."""

    def __init__(self, name: str, prof, options, cases: list[str], progress: Progress,
                 task) -> None:
        self.name, self.prof, self.options, self.cases = name, prof, options, cases
        self.progress, self.task = progress, task
        self.shards: list[tuple] = []           # (gpu, case ids, out dir) per process
        self.outcome: dict[int, tuple[int, bool]] = {}
        self.finished: list[dict] = []
        self.record: dict = {}                  # execute.profile_carry.pass_record
        self.carry = None                       # execute.profile_carry.Carry: taken over
        self.per_case: dict[str, float] = {}    # wall time under the profiler (replays included)
        self.span: list[float] = []             # first process start, last process end
        self.turns: dict[int, float] = {}       # a shard started early: when its turn came
        self._began: dict[str, float] = {}
        self._lock = threading.Lock()

    def mark(self) -> None:
        now = time.monotonic()
        with self._lock:
            self.span = [min(self.span[0], now), max(self.span[1], now)] if self.span \
                else [now, now]

    def on_event(self, ev: dict) -> None:
        if ev.get("name") == "prewarm":  # a waiting process loading its cases: not profiled
            return
        with self._lock:
            if ev["event"] == "start":
                self._began[ev["case_id"]] = time.monotonic()
                self.progress.update(self.task, description=f"{self.name} {ev['case_id']}")
            elif ev["event"] == "done":
                self.per_case[ev["case_id"]] = round(
                    time.monotonic() - self._began[ev["case_id"]], 2)
                self.progress.advance(self.task)
