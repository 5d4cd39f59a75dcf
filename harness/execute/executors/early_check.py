"""The check pass's first worker, started while compile-ahead runs.

A cold GPU run compiles ahead (harness.execute.executors.warm) before its check pass, on the
CPU's cores; the check pass's first worker then started and paid its own set-up (Python,
torch, Triton and Inductor imported, CUDA's context) on the critical path of every GPU.
`EarlyCheck` starts that worker with compile-ahead instead: `--wait-for` a turn file, so it
sets up what launches no kernel (harness.execute.touch, under the GPU lock shared) and waits.
When compile-ahead is over, run_shard gives it the cases left to check and time (`go`), in
place of starting its first worker, and the Driver does whatever it left (a fault it met is
recorded as the Driver records one). Nothing it does before its turn touches a case.
"""
from __future__ import annotations

import threading
from pathlib import Path

from harness.execute import sharing
from harness.execute.executors.process import (MEASURE_PASSES, CaseWatch, Interrupted, join,
                                               stream, worker_argv, worker_env)


class EarlyCheck:
    """One `--passes check,time --wait-for` worker for a shard (`shard`, on `gpu`), writing to
    the shard's measure log; `go(drive, case_ids)` is its turn, `cancel()` ends it unused."""

    def __init__(self, run_dir: Path, *, device: str, limits: dict[str, float],
                 gpu: int | None, shard: str | None, log_path: Path):
        from harness.tuning import gpu_lock

        self.run_dir, self.gpu, self.log_path = Path(run_dir), gpu, log_path
        self.limits = limits
        self.env = {**worker_env(device, gpu), gpu_lock.ENV: sharing.lock_path(run_dir, gpu)}
        self.go_file = sharing.turn_file(run_dir, f"check.{shard}" if shard else "check")
        self.argv = (worker_argv(run_dir, ",".join(MEASURE_PASSES), device, shard=shard)
                     + ["--wait-for", str(self.go_file)])
        self.drive = None  # the Driver whose events and faults these are, from `go`
        self.cancelled = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"early-check-{shard or 'local'}")
        self.thread.start()

    def _run(self) -> None:
        watch = CaseWatch(self.limits, self.cancelled)

        def expired() -> bool:
            stop = self.drive.stop if self.drive is not None else None
            return watch.expired() or bool(stop is not None and stop.is_set())

        def on_ev(ev):
            watch.see(ev)
            if self.drive is not None:
                self.drive.on_event({**ev, "gpu": self.gpu})

        try:
            rc, timed_out = stream(self.argv, self.env, self.log_path, on_ev, watchdog=expired)
        except Interrupted:
            return
        drive = self.drive
        if self.cancelled.is_set() or drive is None or (drive.stop is not None
                                                        and drive.stop.is_set()):
            return
        if watch.case and (timed_out or rc != 0):
            drive.record_fault(watch, rc, timed_out, self.log_path)

    def go(self, drive, case_ids: list[str]) -> None:
        """Its turn: check and time `case_ids` (in this order) for `drive` (process.Driver);
        returns when the worker has ended. Ctrl-C meanwhile ends it and raises Interrupted
        (the run is stored as interrupted, as with a worker started in its turn)."""
        self.drive = drive
        sharing.give_turn(self.go_file, case_ids)
        try:
            join(self.thread)
        except KeyboardInterrupt:
            self.cancel()
            raise Interrupted() from None

    def stop(self) -> None:
        """Ask the worker to end (its watchdog kills it within a fifth of a second)."""
        self.cancelled.set()

    def cancel(self) -> None:
        """End the worker without a turn (the run stopped, or its shard has nothing to do)."""
        self.stop()
        self.thread.join()


def cancel_all(early) -> None:
    """End every worker of `early` (EarlyChecks): all asked first, then waited for, so a second
    Ctrl-C while waiting leaves none of them unasked."""
    early = list(early)
    for e in early:
        e.stop()
    for e in early:
        e.thread.join()
