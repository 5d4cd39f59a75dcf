"""Orchestrates a run: spec -> run dir -> worker passes (compile-ahead, check, time, then the
profiler passes of harness.execute.profiler_passes: ncu, nsys) -> tables.

The orchestrator never initialises CUDA: every pass runs in `python -m harness worker`, wrapped
by ncu/nsys for the profiler passes. A worker that dies (illegal address, segfault) costs the
case in flight, which is recorded as an error; a new worker carries on from the next case.
Ctrl-C leaves a readable partial run (status `interrupted`); `harness run --resume RUN` ends it.
"""
from __future__ import annotations

import os
import random
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.machine import env as envmod
from harness import op_card, store
from harness.experiment import spec
from harness.errors import HarnessError
from harness.execute.executors import Executor, from_manifest, make_executor
from harness.execute.executors.process import Interrupted, kernel_caches, todo
from harness.execute.executors.schedule import case_costs, case_timeout_s, longest_first
from harness.execute.previous import previous_medians
from harness.execute.profiler_early import Early, profilers_due
from harness.execute.profiler_passes import ProfilerPasses
from harness.execute.timeline import Timeline
from harness.execute.code_tree import op_for
from harness.execute.compile_phase import CompilePhase, overlap_wanted
from harness.registry import get_op
from harness.store.results import cases_frame, consolidate

MEASURE_PASSES = ("check", "time")
# X+Y: side by side on the GPUs of --gpus; ab: harness ab's check and interleaved timing
PASS_ORDER = ("compile", "check", "time", "check+time", "ab", "ncu", "nsys", "torch_profiler",
              "ncu+nsys", "ncu+torch_profiler")


class Runner(ProfilerPasses):
    def __init__(self, run_dir: Path, console: Console, executor: Executor | None = None):
        self.run_dir = Path(run_dir)
        self.console = console
        self.manifest = store.load_manifest(self.run_dir)
        self.executor = executor or from_manifest(self.manifest)
        # a resumed run keeps the walls of passes it does not redo; total is this invocation's
        self.pass_wall: dict[str, float] = dict(self.manifest.get("pass_wall_s") or {})
        self.exp = spec.Experiment.model_validate(self.manifest["experiment"])
        self.op = op_for(self.manifest)
        self.device = self.manifest["device"]
        self.passes: dict[str, str] = dict(self.manifest.get("passes", {}))
        self.timeline = Timeline()  # the phases' spans (pass_spans_s); run() restarts it
        self._calibration = None  # calibrate.Measurement, started by gpu_idle
        self._idle_lock = threading.Lock()

    # -- bookkeeping --------------------------------------------------------------------------
    def _set_pass(self, name: str, state: str) -> None:
        self.passes[name] = state
        self.manifest = store.update_manifest(self.run_dir, passes=self.passes)

    def _case_ids(self) -> list[str]:
        return list(store.load_cases(self.run_dir).case_id)

    def _todo(self, pass_name: str) -> list[str]:
        return todo(self.run_dir, pass_name, self._case_ids())

    # -- measure passes (check, time), on the executor ---------------------------------------------
    def plan(self) -> tuple[list[str], dict[str, float], dict[str, float]]:
        """Cases longest first, their estimated cost (s) and their watchdog limits (s)."""
        cases = store.load_cases(self.run_dir)
        cost = case_costs(cases, self.op, self.exp.timing, self.device,
                          previous_medians(self.run_dir), self.exp.correctness.trials)
        limits = {c: case_timeout_s(v, self.exp.timing) for c, v in cost.items()}
        return longest_first(list(cases.case_id), cost, store.shapes(self.run_dir)), cost, limits

    def measure(self, progress: Progress) -> None:
        from harness.execute.executors.process import measure_parts

        parts = measure_parts(store.time_processes(self.run_dir))
        n_cases = len(self._case_ids())
        tasks, totals = {}, {}
        for p in MEASURE_PASSES:  # the time task counts every process's timing of a case
            share = [q for q in parts if q == p or (p == "time" and q not in MEASURE_PASSES)]
            total = totals[p] = n_cases * len(share)
            tasks[p] = progress.add_task(p, total=total, completed=total - sum(
                len(self._todo(q)) for q in share))
        span: dict[str, list[float]] = {}
        t0 = time.monotonic()
        # the cases still to be timed a first time: when none is left (or, on several GPUs,
        # none of one GPU's), the profiler processes start while the time pass still times
        early = Early() if self.early_wanted() else None
        untimed = set(self._todo("time")) if early is not None else set()

        def on_event(ev):
            name, now = ev.get("name"), time.monotonic()
            if name == "time" and ev["event"] == "done" and untimed and self._early is None:
                untimed.discard(ev.get("case_id"))
                if profilers_due(untimed, self.executor.planned, lambda: not self._todo("check")):
                    self.start_early(progress, early)
            name = "time" if name in parts and name not in MEASURE_PASSES else name
            if name not in tasks:
                return
            first = span.setdefault(name, [now, now])
            first[1] = now
            if ev.get("gpu") is not None and self.executor.kind == "gpus":
                lane = span.setdefault(f"{name}@gpu{ev['gpu']}", [now, now])
                lane[1] = now
            if ev["event"] == "start":
                where = f" [gpu {ev['gpu']}]" if ev.get("gpu") is not None else ""
                progress.update(tasks[name], description=f"{name}{where} {ev['case_id']}")
            elif ev["event"] == "done" and ev.get("status") != "deferred":
                progress.advance(tasks[name])

        if not self.manifest.get("retune") and "tuner_picks_from" not in self.manifest:
            from harness.execute.previous import inherit_picks

            try:
                source = inherit_picks(self.run_dir, self.op)
            except HarnessError:  # an unreadable earlier run: this one tunes, as with none
                source = None
            self.manifest = store.update_manifest(self.run_dir, tuner_picks_from=source)
        self.executor.on_shard_done = early.shard_done if early is not None else None
        order, cost, limits = self.plan()
        left = set().union(*(self._todo(p) for p in parts))
        todo_ids = [c for c in order if c in left]
        unchecked = set(self._todo("check"))
        unchecked = [c for c in order if c in unchecked]
        phase = None
        from harness.execute import sharing

        # a gate a killed driver left would hold this run's check workers for ever
        sharing.clear(self.run_dir, sharing.AHEAD)
        try:
            # by default the check pass starts with the compile phase (compile_phase)
            phase = CompilePhase(self, progress, unchecked, limits)
            if not phase.start(overlap=overlap_wanted()):  # else it ends first
                phase.join()
                phase = None
            if phase is None:
                progress.update(tasks["check"],
                                completed=totals["check"] - len(self._todo("check")))
            t0 = time.monotonic()
            if todo_ids:
                self.executor.measure(self.run_dir, todo_ids, cost, limits, self.device,
                                      on_event)
            if phase is not None:
                phase.join()
        finally:  # the compile phase stopped if it runs, the check workers started early and
            if phase is not None:  # not used, the workers' GPU locks and turn files
                phase.stop()  # (harness.execute.sharing),
            self.executor.cancel_early()
            if self._early is None:  # unless profiler processes wait there
                sharing.clear(self.run_dir)
        # the check pass starts with the first worker (its start-up is part of the pass)
        for name in span:
            if name.split("@")[0] == "check":
                span[name][0] = t0
        for name, (a, b) in span.items():
            self.timeline.add(name, a, b)
        span = {p: v for p, v in span.items() if "@" not in p}
        if self.executor.kind == "ray":  # a task does both passes of its cases: one number
            self.pass_wall["check+time"] = round(time.monotonic() - t0, 2)
        elif todo_ids:  # spans from the workers' events (with --gpus the spans overlap)
            self.pass_wall.update({p: round(b - a, 2) for p, (a, b) in span.items()})
        for p in MEASURE_PASSES:
            progress.update(tasks[p], description=p, completed=totals[p])
            self._set_pass(p, "done")

    def compile_ahead(self, progress: Progress, check_ids: list[str],
                      limits: dict[str, float]) -> None:
        """The compile phase (harness.execute.compile_phase), then its end: compile-ahead warms
        the kernel caches for the check pass (GPU runs of the local and --gpus executors, cases
        of implementations that JIT-compile) while the cases that compile nothing are
        checked beside it."""
        phase = CompilePhase(self, progress, check_ids, limits)
        phase.start()
        phase.join()

    def _log(self, name: str) -> Path:
        return store.raw_dir(self.run_dir, "logs") / f"{name}.log"

    # -- the whole run ----------------------------------------------------------------------------
    def run(self) -> None:
        t0 = time.monotonic()
        self.timeline = Timeline(t0)
        with Progress(TextColumn("{task.description:<60.60}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=self.console, transient=False) as progress:
            try:
                self.measure(progress)
                self.early_planned()  # profiler processes started early: their plan is made
                consolidate(self.run_dir, self.op)
                self._profilers(progress)
            except Interrupted:
                self.stop_early()
                consolidate(self.run_dir, self.op)
                store.update_manifest(self.run_dir, status="interrupted",
                                      executor=self.executor.describe())
                raise
            finally:
                self.stop_early()
        t1 = time.monotonic()
        self.finish()
        self.timeline.add("finish", t1)
        self.pass_wall["total"] = round(time.monotonic() - t0, 2)
        self.manifest = store.update_manifest(self.run_dir, pass_wall_s=self.pass_wall,
                                              pass_spans_s=self.timeline.record(),
                                              executor=self.executor.describe())

    def gpu_idle(self, gpu) -> None:
        """GPU `gpu` has done its last case of the run (its last profiler process's cases are
        over, ProfilerPasses._in_turn): the roofline's ceilings, where this GPU model has none
        cached yet, are measured there now (calibrate.Measurement), while the profilers write and
        export their reports, not after them (an empty store's run took 8.6-8.9 s to finish
        on two H100s, most of it calibrating)."""
        from harness.execute.calibrate import start_early

        with self._idle_lock:
            if self.device != "cuda" or self._calibration is not None:
                return
            try:  # whatever goes wrong here, finish() calibrates as before (and says why not)
                self._calibration = start_early(
                    self.run_dir.parent, (self.manifest.get("env") or {}).get("gpu_name"),
                    gpu) or False
            except Exception:
                self._calibration = False

    def finish(self) -> None:
        from harness.analysis.validity import annotate
        from harness.execute.calibrate import ensure

        consolidate(self.run_dir, self.op)
        if self.device == "cuda":  # the run keeps the ceilings it is judged against
            cal = ensure(self.run_dir.parent, (self.manifest.get("env") or {}).get("gpu_name"),
                         self.console, early=self._calibration or None)
            if cal:
                self.manifest = store.update_manifest(self.run_dir, calibration=cal)
        annotate(self.run_dir, self.op)
        cases = store.load_cases(self.run_dir)
        failed_pass = any(v.startswith("failed") for v in self.passes.values())
        pending = bool((cases.status == "pending").any())
        status = "partial" if (failed_pass or pending) else "complete"
        store.update_manifest(self.run_dir, status=status,
                              finished_utc=datetime.now(timezone.utc).isoformat())
        from harness.analysis import pairing

        pairing.record(self.run_dir)  # the previous comparable run: `show`'s since block


def wall_line(walls: dict[str, float]) -> str:
    """`wall: check 41.2 s · time 33.0 s · ncu 20.1 s · nsys 25.3 s · total 130.4 s` (shown
    by `show` at the end of a run; stored as the manifest's pass_wall_s)."""
    keys = [k for k in PASS_ORDER if k in walls] + ["total"]
    return "wall: " + " · ".join(f"{k} {walls[k]:.1f} s" for k in keys if k in walls)


# ---------------------------------------------------------------------------------------------
# entry points used by the CLI

def detect_device(requested: str | None) -> tuple[str, str]:
    present, why = envmod.cuda_device_present()
    if requested == "cuda" and not present:
        raise HarnessError(f"--device cuda: no CUDA device here ({why})")
    if requested in ("cpu", "cuda"):
        return requested, why
    return ("cuda", "") if present else ("cpu", why)


def start(exp_path: str, *, out_root: str, smoke: bool | None, cases_filter: str | None,
          device: str | None, console: Console, argv: list[str], gpus: str | None = None,
          ray: str | None = None, against: str | None = None, retune: bool = False,
          reprofile: bool = False,
          profile_harness: bool = False) -> Path:
    from harness.analysis import pairing

    exp = spec.load(exp_path)  # SpecError before anything is written
    asked = pairing.request(against, out_root)  # StoreError before anything is written
    if ray and ray != "local" and device is None:
        dev, why = "cuda", ""  # the cluster's GPUs, not the driver's, run the cases
    elif gpus and device is None:
        dev, why = "cuda", ""
    else:
        dev, why = detect_device(device)
    executor = make_executor(gpus=gpus, ray=ray, device=dev)  # HarnessError: nothing written
    use_smoke = bool(smoke) or (dev == "cpu" and smoke is None and exp.smoke is not None)
    cases = spec.select(spec.expand(exp, smoke=use_smoke), cases_filter)
    if dev == "cpu":
        console.print(f"[yellow]No CUDA device ({why}):[/] running "
                      f"{'the smoke sweep' if use_smoke else 'the sweep'} on the CPU, Triton "
                      "kernels through the interpreter (TRITON_INTERPRET=1). Timings are CPU "
                      "wall-clock, not comparable with GPU numbers.")
    manifest = {
        "experiment": exp.model_dump(mode="json"),
        "experiment_path": str(exp_path),
        "spec_hash": spec.spec_hash(exp),
        "env": _run_env(dev, executor),
        "device": dev,
        "smoke": use_smoke,
        "cases_filter": cases_filter,
        "seed": random.SystemRandom().randrange(2 ** 31),
        "status": "running",
        "passes": {},
        "command": ["python", "-m", "harness", *argv],
        "created_utc": datetime.now(timezone.utc).isoformat(),
        "executor": executor.describe(),
        "driver": store.driver_record(),
        "kernel_caches": kernel_caches(),  # compile-ahead trusts only the same cache folders
        "against": asked.as_dict() if asked else None,  # None: found at the end of the run
        "retune": retune,  # True: no Tuner pick taken over from the previous run
        "reprofile": reprofile,  # True: no profile carried over (execute.profile_carry)
        "profile_harness": profile_harness,  # raw/harness_profile/: cProfile of each process
        op_card.KEY: op_card.card(get_op(exp.op)),  # what `show` and `report` need of the op
    }
    run_dir = store.create_run(out_root, exp.name, manifest)
    store.write_table(run_dir, "cases", cases_frame(cases))
    console.print(f"run [bold]{run_dir.name}[/]: {len(cases)} cases "
                  f"({len(exp.impl_names())} implementations x "
                  f"{len(cases) // max(1, len(exp.impl_names()))} shapes) on {dev}"
                  f"{_where(executor)}")
    _run(run_dir, console, executor, profile_harness)
    return run_dir


def _run_env(dev: str, executor: Executor) -> dict:
    """The fingerprint; with --gpus its GPU fields are those of the run's first GPU (which may
    not be GPU 0), so `compare` checks the GPUs that actually ran the cases."""
    env = envmod.fingerprint(dev)
    first = (executor.describe().get("gpu_fingerprints") or {})
    gpu = next(iter(first.values()), None) if first else None
    if gpu:
        env.update({k: v for k, v in gpu.items() if k in env})
    return env


def _where(executor: Executor) -> str:
    d = executor.describe()
    if d["kind"] == "gpus":
        return f", GPUs {', '.join(str(g) for g in d['gpus'])} (one worker each)"
    if d["kind"] == "ray":
        return f", Ray tasks ({d.get('address')})"
    return ""


def _run(run_dir: Path, console: Console, executor: Executor | None = None,
         profile_harness: bool = False) -> None:
    from harness.execute import selfprofile

    before = os.environ.get(selfprofile.ENV)
    if profile_harness:
        folder = selfprofile.enable_for(run_dir)
        console.print(f"profiling the harness itself (cProfile per process) into {folder}")
    try:
        with selfprofile.profiled("driver"):
            Runner(run_dir, console, executor).run()
    except Interrupted:
        raise Interrupted(run_dir) from None
    finally:  # a later run in this process is not profiled unless it asks
        if before is None:
            os.environ.pop(selfprofile.ENV, None)
        else:
            os.environ[selfprofile.ENV] = before


def resume(ref: str, *, out_root: str, console: Console, gpus: str | None = None,
           ray: str | None = None, against: str | None = None,
           profile_harness: bool = False) -> Path:
    """Finish a stopped run with the executor it started with (or the one given now)."""
    from harness.analysis import pairing

    run_dir = store.resolve_run(ref, out_root)
    asked = pairing.request(against, out_root) if against is not None else None
    m = store.load_manifest(run_dir)
    status = store.effective_status(m)
    if status == "running":
        drv = m.get("driver") or {}
        raise HarnessError(f"run {run_dir.name} is still running (pid {drv.get('pid')} on "
                           f"{drv.get('host')}); stop it first or wait")
    if against is not None:  # a new choice of the previous run (auto: found at the end)
        store.update_manifest(run_dir, against=asked.as_dict() if asked else None)
    if status == "complete":
        if against is not None:  # paired again now; an unfinished run is paired at its end
            pairing.record(run_dir)
        console.print(f"run {run_dir.name} is already complete")
        return run_dir
    ex = m.get("executor") or {}
    if ex.get("kind") == "ray" and not (gpus or ray):
        dev = m["device"]
    else:
        dev, _ = detect_device(m["device"])
    executor = make_executor(gpus=gpus, ray=ray, device=dev) if (gpus or ray) else \
        from_manifest(m)
    store.update_manifest(run_dir, status="running", driver=store.driver_record(),
                          executor=executor.describe())
    console.print(f"resuming run [bold]{run_dir.name}[/] on {dev}{_where(executor)}")
    _run(run_dir, console, executor, profile_harness)
    return run_dir
