"""The profiler passes started before the measure passes end (a part of
harness.execute.runner.Runner through ProfilerPasses).

Once every case has its first timing (each case's status is then final), the runner plans the
profiler passes in a thread and starts their processes while the time pass's later process
times (`EarlyStart.start_early`). The processes start (Python, the imports, the profiler's own,
then CUDA's and their compilers' set-up: harness.execute.touch, between two timed cases) and
wait for their GPU's gate (`Early.gate`): it opens when that GPU's shard of the measure
passes has ended (--gpus: `Executor.on_shard_done`), or all of them have (`release`). Then the
first has its turn and the others load their cases meanwhile (ProfilerPasses._in_turn). On an
H100 ncu's process had spent 4.0-4.9 s starting before its first case, after the time pass;
1.2-1.6 s since (flash.yaml cold, its run less its cases). `HARNESS_EARLY_PROFILERS=0`: the
profiler processes start after the time pass.
"""
from __future__ import annotations

import os
import threading

from rich.progress import Progress

from harness.execute import sharing
from harness.execute.executors.process import Interrupted, join

EARLY_ENV = "HARNESS_EARLY_PROFILERS"  # "0": the profiler processes start after the time pass


class Early:
    """Profiler passes started before the measure passes end: the thread that plans them and
    runs their processes, and the gates those processes wait at, one per GPU."""

    def __init__(self) -> None:
        self.stop = threading.Event()     # Ctrl-C or a failed measure pass: kill them
        self.planned = threading.Event()  # the run's tables are the runner thread's again
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.cleared = False              # the run's locks removed (the runner's thread)
        self._lock = threading.Lock()
        self._released = False            # every GPU's measure passes have ended
        self._done: set = set()           # GPUs whose shard of the measure passes has ended
        self._gates: dict = {}

    def gate(self, gpu) -> threading.Event:
        """Set when GPU `gpu` may profile: its shard of the measure passes has ended (--gpus),
        or all of them have (`release`)."""
        with self._lock:
            ev = self._gates.setdefault(gpu, threading.Event())
            if gpu in self._done or self._released:
                ev.set()
            return ev

    def shard_done(self, gpu) -> None:
        with self._lock:
            self._done.add(gpu)
            if gpu in self._gates:
                self._gates[gpu].set()

    def release(self) -> None:
        with self._lock:
            self._released = True
            for ev in self._gates.values():
                ev.set()


def measure_left_s(run_dir, gpus: list, planned: dict | None = None,
                   est: dict[str, float] | None = None) -> list[float]:
    """Per GPU of `gpus` (--gpus shards), the seconds its measure passes still take: its
    later time processes' cases not timed yet (parts time_p<k>.gpu<g>), each weighed by what
    its first timing took (parts time.gpu<g>: a later process times a case as long), and the
    cases of its shard (`planned`, GPU -> case ids) without a first timing yet, each once per
    time process, weighed by its estimated cost (`est`) times what the first timings so far
    took against theirs. On two H100s the profilers of the GPU whose shard ended 6.4 s later
    ran 10.8 s after the other GPU's were done (flash.yaml cold, --gpus all), before the
    profilers' deal weighed this."""
    from harness import store

    records = store.read_parts(run_dir, "time")
    first = [r for r in records if r.get("status") == "ok"]
    processes = store.time_parts(store.time_processes(run_dir))
    later = [{r["case_id"] for r in store.read_parts(run_dir, part)} for part in processes[1:]]
    est = est or {}
    timed = {r["case_id"]: r.get("wall_s") or 0.0 for r in first}
    timed_est = sum(est.get(c, 0.0) for c in timed)
    scale = sum(timed.values()) / timed_est if timed_est > 0 else 1.0
    done = {r["case_id"] for r in records}
    return [sum((r.get("wall_s") or 0.0) for r in first if r.get("gpu") == g
                for seen in later if r["case_id"] not in seen)
            + sum(scale * est.get(c, 0.0) * len(processes)
                  for c in (planned or {}).get(g, []) if c not in done) for g in gpus]


def profilers_due(untimed: set, planned: dict | None, all_checked) -> bool:
    """Whether the profiler passes may be planned and their processes started now: every case
    has its first timing (each case's status is then final), or, on several GPUs (`planned`:
    GPU -> its shard's case ids), one GPU's shard has its first timings and every case is
    checked (`all_checked()`): that GPU's later time process then still times long enough for
    its first profiler process to set up (on two H100s ncu's took 7.5 s; planned once every
    case had its first timing, it set up 5.9 s past its GPU's end). A case whose timing fails
    after the deal is left out at its process's turn (ProfilerShards.unfailed)."""
    if not untimed:
        return True
    if not planned or len(planned) < 2:
        return False
    return any(not untimed.intersection(ids) for ids in planned.values()) and all_checked()


class EarlyStart:
    """ProfilerPasses' early start (needs run_dir, op, device, executor, exp, _done() and
    _profilers())."""

    _early: Early | None = None  # started (start_early)

    def early_wanted(self) -> bool:
        """Whether this run's profiler processes may start before its measure passes end: a
        GPU run on this host (local or --gpus) with an ncu or nsys pass still to do."""
        prof = self.exp.profile
        return (self.device == "cuda" and self.executor.kind in ("local", "gpus")
                and os.environ.get(EARLY_ENV, "1") != "0"
                and any(opts is not None and opts.enabled and not self._done(name)
                        for name, opts in (("ncu", prof.ncu), ("nsys", prof.nsys))))

    def start_early(self, progress: Progress, early: Early) -> None:
        """Plan the profiler passes and start their processes now, in a thread (the module
        doc); `early` has counted the GPUs whose shard of the measure passes is over."""
        if self._early is not None:
            return
        from harness.store.results import consolidate

        def main() -> None:
            try:
                consolidate(self.run_dir, self.op)  # the statuses the pass's cases are chosen by
                self._profilers(progress, early)
            except BaseException as exc:  # re-raised in the runner's thread (_finish_early)
                early.error = exc
            finally:
                early.planned.set()

        early.thread = threading.Thread(target=main, name="profilers-early", daemon=True)
        early.thread.start()
        self._early = early

    def early_planned(self) -> None:
        """Wait until the early thread has planned its passes (it reads and writes the run's
        tables until then)."""
        if self._early is not None:
            self._early.planned.wait()

    def stop_early(self) -> None:
        """Kill the early profiler processes (a measure pass failed or was interrupted), wait
        for them and remove the run's locks and turn files."""
        early = self._early
        if early is None or early.cleared:
            return
        early.stop.set()
        self._join_early()

    def _join_early(self) -> None:
        """Wait for the early thread; then nothing of the run waits on its locks and turn
        files: remove them (the runner's thread does, once)."""
        early = self._early
        early.thread.join()
        sharing.clear(self.run_dir)
        early.cleared = True

    def _finish_early(self) -> None:
        """The early processes' turn (the measure passes are over): wait for their passes."""
        early = self._early
        early.release()
        try:
            join(early.thread)
        except KeyboardInterrupt:
            self.stop_early()
            raise Interrupted() from None
        self._join_early()
        if early.error is not None:
            raise early.error
