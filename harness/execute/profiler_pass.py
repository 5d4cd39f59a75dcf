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
        self.finished: dict[int, dict] = {}    # shard -> its export (export)
        self.record: dict = {}                  # execute.profile_carry.pass_record
        self.carry = None                       # execute.profile_carry.Carry: taken over
        self.per_case: dict[str, float] = {}    # wall time under the profiler (replays included)
        self.span: list[float] = []             # first process start, last process end
        self.turns: dict[int, float] = {}       # a shard started early: when its turn came
        self.runs: dict[int, list[float]] = {}  # a shard's process: [its turn or start, end]
        self._began: dict[str, float] = {}
        self.edges: dict[str, float] = {}       # set up, first case started, last done, prewarm
        self.shard_edges: dict[int, dict[str, float]] = {}  # the same, per shard
        self.over: dict[int, threading.Event] = {}  # a shard's process has done its cases
        self._lock = threading.Lock()

    def export(self, i: int, run_dir, timeline) -> None:
        """Export and parse shard i's capture into `finished[i]` ({frame, tables, error,
        tables_error, export_s}): whatever fails is kept there, not raised (the timing results
        and the raw files stay); `timeline` gets its span."""
        _gpu, ids, out_dir = self.shards[i]
        self.progress.update(self.task, description=f"{self.name} export")
        t0 = time.monotonic()
        got: dict = {"frame": None, "tables": {}, "error": None, "tables_error": None}
        try:
            if self.name == "torch_profiler":
                from harness.profilers.torch_profiler import write_kernels
                write_kernels(run_dir, out_dir, ids)
            self.prof.export(out_dir)
            got["frame"] = self.prof.parse(out_dir)
        except Exception as exc:  # keep the timing results and the raw files whatever happens
            got["error"] = exc
        else:
            try:  # tables besides metrics (ncu: source lines); a failure costs only them
                got["tables"] = self.prof.extra_tables(out_dir)
            except Exception as exc:
                got["tables_error"] = exc
        got["export_end"] = time.monotonic()
        got["export_s"] = got["export_end"] - t0
        timeline.add(f"{self.name} export", t0)
        self.finished[i] = got

    def cases_over(self, i: int) -> threading.Event:
        """Set when shard i's process has done its last case and handed back its cached
        memory (the worker's `end` event: its profiler may still be writing its report), or
        has ended (ProfilerPasses._one_process)."""
        with self._lock:
            return self.over.setdefault(i, threading.Event())

    def events(self, i: int):
        """on_event for shard i's process: `end` sets cases_over(i)."""
        def on(ev: dict) -> None:
            if ev.get("event") == "end":
                self.cases_over(i).set()
            else:
                self.on_event(ev, i)
        return on

    def mark(self) -> None:
        with self._lock:
            self._mark(time.monotonic())

    def _mark(self, now: float) -> None:
        self.span = [min(self.span[0], now), max(self.span[1], now)] if self.span else [now, now]

    def on_event(self, ev: dict, i: int | None = None) -> None:
        """A worker's event, from shard `i`'s process when given."""
        now = time.monotonic()
        with self._lock:
            edges = [self.edges] + ([self.shard_edges.setdefault(i, {})] if i is not None else [])
            if ev.get("event") == "ready":  # a process started ahead: set up (worker.touch)
                for e in edges:
                    e["ready"] = now  # the pass's: its latest process's
                return
            if ev.get("name") == "prewarm":  # a waiting process loading its cases: not profiled
                if ev.get("event") == "done":
                    for e in edges:
                        e["prewarm_done"] = now
                return
            if ev["event"] == "start":
                for e in edges:
                    e.setdefault("first_start", now)
                self._began[ev["case_id"]] = now
                self.progress.update(self.task, description=f"{self.name} {ev['case_id']}")
            elif ev["event"] == "done":
                for e in edges:
                    e["last_done"] = now
                self.per_case[ev["case_id"]] = round(now - self._began[ev["case_id"]], 2)
                self.progress.advance(self.task)

    def ran(self, i: int, start: float) -> None:
        """Shard i's process, which ran cases from `start` (its turn, or its start where it did
        not wait for one), has ended: the pass's span reaches its end."""
        now = time.monotonic()
        with self._lock:
            self._mark(now)
            self.runs[i] = [start, now]

    def phases(self) -> dict:
        """Where the span went besides the cases (seconds): `to_first_case_s`, from the turn
        (the span's start) to the first case (loading what the prewarm had not); `after_last_s`,
        from the last case to the process's end (the profiler writing its report);
        `prewarm_end_s`, when the prewarm's last call ended, from the turn (negative: before
        it); `ready_s`, when a process started ahead of its turn had set itself up (imports,
        CUDA's context under the profiler: worker.touch), from the turn (positive: its turn
        waited for its start-up). Only what was seen. A pass of several processes (--gpus)
        adds `processes`, the same per process with its GPU, its cases and its own run (turn
        to end): the pass's figures run from its first turn, so they do not say which process
        waited."""
        if not self.span:
            return {}
        out = _phases(self.span[0], self.span[1], self.edges)
        if len(self.shards) > 1:  # each process's own (the pass's run from the first turn)
            out["processes"] = [
                {"gpu": self.shards[i][0], "cases": len(self.shards[i][1]),
                 "run_s": round(b - a, 2), **_phases(a, b, self.shard_edges.get(i, {}))}
                for i, (a, b) in sorted(self.runs.items())]
        return out


def _phases(t0: float, t1: float, e: dict[str, float]) -> dict[str, float]:
    out = {"to_first_case_s": e.get("first_start", t1) - t0}
    if "last_done" in e:
        out["after_last_s"] = t1 - e["last_done"]
    if "prewarm_done" in e:
        out["prewarm_end_s"] = e["prewarm_done"] - t0
    if "ready" in e:
        out["ready_s"] = e["ready"] - t0
    return {k: round(v, 2) for k, v in out.items()}
