"""A GPU run's compile phase: compile-ahead (harness.execute.executors.warm), the checks of the
cases that compile nothing beside it, and the check pass's first workers set up meanwhile
(early_check).

By default the check pass does not wait for the phase's end (`overlap`): its workers get their
turn as the phase starts, set CUDA up, and check each case as soon as compile-ahead has built
its kernels (sharing.AheadGate: its warm record), leaving the cases of the checks beside it to
them until they end. Nothing is timed while compile-ahead's workers run (gpu_lock.held_off): a
case that would time a Tuner's, an autotuner's or Inductor's configs waits for their end, with
its kernels and graphs loaded meanwhile; one that runs out of memory waits for the whole
phase. The time pass and its second process wait for the phase's end too. (Timed beside
compile-ahead, on two H100s, the Tuners' first-pass timings of 7 and 8 candidates in 520 came
out over 1.15x, up to 3.3x, those of runs without.) On two H100s the GPUs had idled 7-9 s of
a 19-22 s phase after the checks beside it, while the check pass, 25-41 s, waited for its end.
`HARNESS_CHECK_DURING_COMPILE=0` runs the phase first, the check pass after it.
"""
from __future__ import annotations

import os
import threading
import time

from rich.progress import Progress

from harness import store
from harness.execute import sharing
from harness.execute.executors.process import Interrupted, join

OVERLAP_ENV = "HARNESS_CHECK_DURING_COMPILE"


def overlap_wanted() -> bool:
    return os.environ.get(OVERLAP_ENV, "1") != "0"


class CompilePhase:
    """`start` the phase for the check pass's `check_ids` (in check order), `join` it (its
    record: the manifest's compile_ahead, the wall `compile`, the timeline), or `stop` it."""

    def __init__(self, runner, progress: Progress, check_ids: list[str],
                 limits: dict[str, float]):
        from harness.execute.executors.warm import warm_cases

        self.runner, self.progress, self.check_ids, self.limits = runner, progress, check_ids, limits
        active = (runner.device == "cuda" and runner.exp.timing.compile_ahead
                  and runner.executor.kind in ("local", "gpus") and bool(check_ids))
        self.ids, self.skipped = (warm_cases(runner.run_dir, runner.op, check_ids)
                                  if active else ([], 0))
        self.out = {"workers": 0, "cases": 0, "wall_s": 0.0}
        self.thread = self.side = self.error = self.task = None
        self.halt = threading.Event()
        self.t0 = self.t_end = time.monotonic()
        self.gated = False

    def start(self, overlap: bool = False) -> bool:
        """Start compile-ahead and the checks beside it; with `overlap`, the check pass's
        workers may start now (True: they may; False: nothing to compile, they need not
        wait for anything)."""
        if not self.ids:
            return False
        r = self.runner
        self.task = self.progress.add_task("compile", total=len(self.ids))
        self.t0 = time.monotonic()
        gpus = getattr(r.executor, "gpus", None) or [None]
        self.side = _CheckBeside(r, self.progress, self.check_ids, self.limits, gpus,
                                 on_end=self._ended)
        if overlap:  # before any check worker starts: each reads it as it starts
            sharing.AheadGate.start(r.run_dir, self.ids, self.side.ids)
            self.gated = True
        # the check pass's first workers set themselves up meanwhile (early_check;
        # HARNESS_EARLY_CHECK=0: they start after compile-ahead, as before)
        if os.environ.get("HARNESS_EARLY_CHECK", "1") != "0":
            r.executor.start_early(r.run_dir, r.device, self.limits)
        self.side.start()
        self.thread = threading.Thread(target=self._compile, args=(gpus,), daemon=True,
                                       name="compile-ahead")
        self.thread.start()
        return overlap

    def _compile(self, gpus: list) -> None:
        from harness.execute.executors.warm import compile_ahead, compile_units

        r = self.runner
        try:
            self.out = compile_ahead(
                r.run_dir, self.ids, device=r.device, limits=self.limits, gpus=gpus,
                on_event=progress_events(self.progress, self.task, "warm", "compile"),
                units=compile_units(r.run_dir, r.op, self.ids), stop=self.halt,
                gpu_mib=(r.manifest.get("env") or {}).get("gpu_memory_mib"))
        except BaseException as exc:  # re-raised by join
            self.error = exc
        finally:
            self._ended("warm")

    def _ended(self, what: str) -> None:
        self.t_end = max(self.t_end, time.monotonic())
        if self.gated:
            sharing.AheadGate.end(self.runner.run_dir, what)

    def stop(self) -> None:
        self.halt.set()
        if self.side is not None:
            self.side.stop()
        if self.thread is not None:
            self.thread.join()

    def join(self) -> None:
        """Wait for the phase; record it (the manifest's compile_ahead, the wall, the
        timeline). A failure of compile-ahead's driving thread is raised here."""
        r = self.runner
        beside = None
        try:
            join(self.thread)
            beside = self.side.join() if self.side is not None else None
        except KeyboardInterrupt:  # the run is left readable, as from a worker's Ctrl-C
            self.stop()
            raise Interrupted() from None
        except BaseException:
            self.stop()
            raise
        if self.error is not None:
            raise self.error
        if self.task is not None:
            self.progress.update(self.task, description="compile", completed=len(self.ids))
        if self.out["workers"]:  # the phase: compile-ahead and the checks beside it
            r.pass_wall["compile"] = round(self.t_end - self.t0, 2)
            r.timeline.add("compile", self.t0, self.t_end)
        if self.ids or self.skipped:  # skipped: checked on this host by the previous run of
            rec = {**self.out, "skipped": self.skipped}  # the same code
            if beside:
                rec["checked_beside"] = beside
            if self.gated:
                rec["check_during"] = True
            r.manifest = store.update_manifest(r.run_dir, compile_ahead=rec)


class _CheckBeside:
    """The check of the cases that compile nothing, beside compile-ahead (the GPU is idle while
    the CPU compiles; harness.execute.executors.warm.check_beside), in a thread of its own;
    `on_end("beside")` once it is over (or at once: nothing to check)."""

    def __init__(self, runner, progress: Progress, check_ids: list[str],
                 limits: dict[str, float], gpus: list, on_end):
        from harness.execute.executors.warm import check_beside_cases

        self.result: dict | None = None
        self.halt = threading.Event()
        self.ids = check_beside_cases(runner.run_dir, runner.op, check_ids)
        self.thread = None
        self.args = (runner, progress, limits, gpus, on_end)

    def start(self) -> None:
        from harness.execute.executors.warm import check_beside
        runner, progress, limits, gpus, on_end = self.args
        if not self.ids:
            on_end("beside")
            return
        task = progress.add_task("check beside compile", total=len(self.ids))

        def work() -> None:
            try:
                self.result = check_beside(
                    runner.run_dir, self.ids, device=runner.device, limits=limits, gpus=gpus,
                    stop=self.halt,
                    on_event=progress_events(progress, task, "check", "check beside compile"))
            finally:
                on_end("beside")

        self.thread = threading.Thread(target=work, name="check-beside", daemon=True)
        self.thread.start()

    def join(self) -> dict | None:
        join(self.thread)
        return self.result

    def stop(self) -> None:
        self.halt.set()
        if self.thread is not None:
            self.thread.join()


def progress_events(progress: Progress, task, name: str, label: str):
    """A workers' event callback for pass `name`: its current case on `task`'s line
    (`label case_id`), one step forward per case done."""
    def on_event(ev: dict) -> None:
        if ev.get("name") != name:
            return
        if ev["event"] == "start":
            progress.update(task, description=f"{label} {ev['case_id']}")
        elif ev["event"] == "done":
            progress.advance(task)

    return on_event
