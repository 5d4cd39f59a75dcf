"""Orchestrates a run: spec -> run dir -> worker passes (check, time, ncu, nsys) -> tables.

The orchestrator never initialises CUDA: every pass runs in `python -m harness worker`, wrapped
by ncu/nsys for the profiler passes. A worker that dies (illegal address, segfault) costs the
case in flight, which is recorded as an error; a new worker carries on from the next case.
Ctrl-C leaves a readable partial run (status `interrupted`); `harness run --resume RUN` ends it.
"""
from __future__ import annotations

import fnmatch
import json
import os
import queue
import random
import shlex
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness import env as envmod
from harness import spec, store
from harness.errors import HarnessError
from harness.registry import get_op
from harness.results import cases_frame, consolidate

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MEASURE_PASSES = ("check", "time")
MAX_RESTARTS = 50


class Interrupted(Exception):
    pass


def worker_env(device: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT)] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    return env


def worker_argv(run_dir: Path, passes: str, device: str, cases: list[str] | None = None,
                tag: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "harness", "worker", "--run", str(Path(run_dir).resolve()),
            "--passes", passes, "--device", device]
    if cases:
        argv += ["--cases", ",".join(cases)]
    if tag:
        argv += ["--tag", tag]
    return argv


def stream(argv: list[str], env: dict, log_path: Path, on_event, timeout: float | None = None):
    """Run argv in its own process group; `@@harness` lines -> on_event, the rest -> log.

    Returns (returncode, timed_out). Ctrl-C kills the group and raises Interrupted.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"$ {shlex.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1, start_new_session=True)
        lines: queue.Queue = queue.Queue()

        def pump():
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + timeout if timeout else None
        timed_out = False
        try:
            while True:
                try:
                    line = lines.get(timeout=0.2)
                except queue.Empty:
                    if deadline and time.monotonic() > deadline:
                        timed_out = True
                        _kill(proc)
                        break
                    continue
                if line is None:
                    break
                if line.startswith("@@harness "):
                    try:
                        on_event(json.loads(line[len("@@harness "):]))
                    except json.JSONDecodeError:
                        log.write(line)
                else:
                    log.write(line)
            rc = proc.wait()
        except KeyboardInterrupt:
            _kill(proc)
            log.write("[interrupted by Ctrl-C]\n")
            raise Interrupted() from None
        log.write(f"[exit {rc}{' (timed out)' if timed_out else ''}]\n")
    return rc, timed_out


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


class Runner:
    def __init__(self, run_dir: Path, console: Console):
        self.run_dir = Path(run_dir)
        self.console = console
        self.manifest = store.load_manifest(self.run_dir)
        self.exp = spec.Experiment.model_validate(self.manifest["experiment"])
        self.op = get_op(self.exp.op)
        self.device = self.manifest["device"]
        self.passes: dict[str, str] = dict(self.manifest.get("passes", {}))

    # -- bookkeeping --------------------------------------------------------------------------
    def _set_pass(self, name: str, state: str) -> None:
        self.passes[name] = state
        self.manifest = store.update_manifest(self.run_dir, passes=self.passes)

    def _case_ids(self) -> list[str]:
        return list(store.load_cases(self.run_dir).case_id)

    def _todo(self, pass_name: str) -> list[str]:
        done = {r["case_id"] for r in store.read_parts(self.run_dir, pass_name)}
        return [c for c in self._case_ids() if c not in done]

    # -- measure passes (check, time) -----------------------------------------------------------
    def measure(self, progress: Progress) -> None:
        tasks = {}
        for p in MEASURE_PASSES:
            total = len(self._case_ids())
            tasks[p] = progress.add_task(p, total=total, completed=total - len(self._todo(p)))
        current: dict[str, str | None] = {"pass": None, "case": None}

        def on_event(ev):
            if ev["event"] == "start":
                current.update({"pass": ev["name"], "case": ev["case_id"]})
                progress.update(tasks[ev["name"]], description=f"{ev['name']} {ev['case_id']}")
            elif ev["event"] == "done":
                current.update({"pass": None, "case": None})
                progress.advance(tasks[ev["name"]])

        restarts = 0
        while any(self._todo(p) for p in MEASURE_PASSES):
            before = sum(len(self._todo(p)) for p in MEASURE_PASSES)
            argv = worker_argv(self.run_dir, ",".join(MEASURE_PASSES), self.device)
            rc, _ = stream(argv, worker_env(self.device), self._log("measure"), on_event)
            if rc != 0 and current["case"]:
                store.append_part(self.run_dir, current["pass"], {
                    "case_id": current["case"], "status": "error",
                    "error": f"worker died ({_describe_rc(rc)}); log: "
                             f"{self._log('measure').relative_to(self.run_dir)}"})
                progress.advance(tasks[current["pass"]])
                current.update({"pass": None, "case": None})
            after = sum(len(self._todo(p)) for p in MEASURE_PASSES)
            restarts += 1
            if after == before or restarts > MAX_RESTARTS:
                raise HarnessError(f"the worker makes no progress (exit {_describe_rc(rc)}); "
                                   f"see {self._log('measure')}")
        for p in MEASURE_PASSES:
            progress.update(tasks[p], description=p)
            self._set_pass(p, "done")

    def _log(self, name: str) -> Path:
        return store.raw_dir(self.run_dir, "logs") / f"{name}.log"

    # -- profiler passes ------------------------------------------------------------------------
    def profile_cases(self, which) -> list[str]:
        cases = store.load_cases(self.run_dir)
        runnable = cases[cases.status.isin(["ok", "failed"])]
        if which == "all":
            return list(runnable.case_id)
        if which == "first":
            first = runnable.shape_id.iloc[0] if len(runnable) else None
            return list(runnable[runnable.shape_id == first].case_id)
        return [c for c in runnable.case_id if any(fnmatch.fnmatchcase(c, p) for p in which)]

    def profile(self, progress: Progress, prof_name: str, options) -> None:
        from harness.profilers import base

        prof = base.get(prof_name)
        avail = prof.availability()
        if not avail.ok:
            self._set_pass(prof_name, f"skipped: {avail.detail}")
            return
        cases = self.profile_cases(options.cases if hasattr(options, "cases") else "all")
        if not cases:
            self._set_pass(prof_name, "skipped: no runnable case to profile")
            return
        out_dir = store.raw_dir(self.run_dir, prof_name)
        # one report per pass: a pass stopped half-way (Ctrl-C, timeout) is redone whole,
        # not just for the cases its worker had not reached
        store.clear_parts(self.run_dir, prof_name)
        task = progress.add_task(prof_name, total=len(cases))
        options = prof.prepare(options, store.load_cases(self.run_dir), cases)
        argv = prof.command(worker_argv(self.run_dir, "torch_profiler" if prof_name ==
                                        "torch_profiler" else "profile", self.device, cases,
                                        tag=prof_name), out_dir, options)

        per_case: dict[str, float] = {}
        began: dict[str, float] = {}

        def on_event(ev):  # per-case wall time under the profiler (replay passes included)
            if ev["event"] == "start":
                began[ev["case_id"]] = time.monotonic()
                progress.update(task, description=f"{prof_name} {ev['case_id']}")
            elif ev["event"] == "done":
                per_case[ev["case_id"]] = round(time.monotonic() - began[ev["case_id"]], 2)
                progress.advance(task)

        env = {**worker_env(self.device), **prof.env()}
        started = time.monotonic()
        log = out_dir / f"{prof_name}.log"
        rc, timed_out = stream(argv, env, log, on_event, timeout=options.timeout_s)
        wall = time.monotonic() - started
        progress.update(task, description=prof_name)
        problem = _log_problem(prof_name, log.read_text(errors="replace"))
        if problem and "ERR_NVGPUCTRPERM" in problem:
            self._set_pass(prof_name, f"skipped: {problem}")
            return
        state = "done"
        if timed_out:
            state = f"failed: timed out after {options.timeout_s:g} s (log: {log})"
        elif rc != 0:
            state = f"failed: exit {_describe_rc(rc)}{': ' + problem if problem else ''} (log: {log})"
        try:
            if prof_name == "torch_profiler":
                self._write_torch_profiler_kernels(out_dir)
            prof.export(out_dir)
            df = prof.parse(out_dir)
        except Exception as exc:  # keep the timing results and the raw files whatever happens
            self._set_pass(prof_name, f"failed: {type(exc).__name__}: {exc}")
            return
        self._merge_metrics(prof.source, df)
        state = self._write_extra_tables(prof, out_dir, state)
        timing = {"wall_s": round(wall, 2), "cases": len(cases), "per_case_s": per_case}
        self.manifest = store.update_manifest(
            self.run_dir, profiler_wall_s={**self.manifest.get("profiler_wall_s", {}),
                                           prof_name: timing})
        self._set_pass(prof_name, state)

    def _write_torch_profiler_kernels(self, out_dir: Path) -> None:
        from harness.profilers.torch_profiler import KERNELS_FILE

        recs = store.read_parts(self.run_dir, "torch_profiler")
        per_case = {r["case_id"]: r.get("kernels", []) for r in recs if r["status"] == "ok"}
        store.write_json(out_dir / KERNELS_FILE, per_case)

    def _write_extra_tables(self, prof, out_dir: Path, state: str) -> str:
        """Tables a profiler makes besides metrics (ncu: source_lines); a failure here is noted
        in the pass state and costs nothing else."""
        try:
            for name, table in prof.extra_tables(out_dir).items():
                store.write_table(self.run_dir, name, table)
        except Exception as exc:  # the metrics are stored already; keep them
            return f"{state} (source lines failed: {type(exc).__name__}: {exc})"
        return state

    def _merge_metrics(self, source: str, df) -> None:
        import pandas as pd

        old = store.load_metrics(self.run_dir)
        old = old[old.source != source] if len(old) else old
        frames = [f for f in (old, df) if len(f)]
        merged = pd.concat(frames, ignore_index=True) if frames else df
        store.write_table(self.run_dir, "metrics", merged)

    # -- the whole run ----------------------------------------------------------------------------
    def run(self) -> None:
        with Progress(TextColumn("{task.description:<60.60}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=self.console, transient=False) as progress:
            try:
                self.measure(progress)
                consolidate(self.run_dir, self.op)
                self._profilers(progress)
            except Interrupted:
                consolidate(self.run_dir, self.op)
                store.update_manifest(self.run_dir, status="interrupted")
                raise
        self.finish()

    def _profilers(self, progress: Progress) -> None:
        prof = self.exp.profile
        if self.device != "cuda":
            for name, opts in (("ncu", prof.ncu), ("nsys", prof.nsys)):
                if opts is not None and opts.enabled:
                    self._set_pass(name, "skipped: no CUDA device (ncu and nsys need an "
                                         "NVIDIA GPU)")
            return
        if prof.ncu is not None and prof.ncu.enabled and not self._done("ncu"):
            self.profile(progress, "ncu", prof.ncu)
        if prof.nsys is not None and prof.nsys.enabled and not self._done("nsys"):
            from harness.profilers.nsys import Nsys

            if Nsys().is_available():
                self.profile(progress, "nsys", prof.nsys)
            else:
                self._set_pass("nsys", f"skipped: {Nsys().availability().detail}; "
                                       "kernel table from torch.profiler instead")
                self.profile(progress, "torch_profiler", prof.nsys)

    def _done(self, name: str) -> bool:
        return self.passes.get(name, "").startswith(("done", "skipped"))

    def finish(self) -> None:
        from harness.analysis.validity import annotate
        from harness.calibrate import ensure

        consolidate(self.run_dir, self.op)
        if self.device == "cuda":  # the run keeps the ceilings it is judged against
            cal = ensure(self.run_dir.parent, (self.manifest.get("env") or {}).get("gpu_name"),
                         self.console)
            if cal:
                self.manifest = store.update_manifest(self.run_dir, calibration=cal)
        annotate(self.run_dir, self.op)
        cases = store.load_cases(self.run_dir)
        failed_pass = any(v.startswith("failed") for v in self.passes.values())
        pending = bool((cases.status == "pending").any())
        status = "partial" if (failed_pass or pending) else "complete"
        store.update_manifest(self.run_dir, status=status,
                              finished_utc=datetime.now(timezone.utc).isoformat())


def _describe_rc(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return str(rc)


def _log_problem(prof_name: str, text: str) -> str | None:
    if prof_name == "ncu":
        from harness.profilers.ncu import check_log

        return check_log(text)
    return None


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
          device: str | None, console: Console, argv: list[str]) -> Path:
    exp = spec.load(exp_path)  # SpecError before anything is written
    dev, why = detect_device(device)
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
        "env": envmod.fingerprint(dev),
        "device": dev,
        "smoke": use_smoke,
        "cases_filter": cases_filter,
        "seed": random.SystemRandom().randrange(2 ** 31),
        "status": "running",
        "passes": {},
        "command": ["python", "-m", "harness", *argv],
        "created_utc": datetime.now(timezone.utc).isoformat(),
    }
    run_dir = store.create_run(out_root, exp.name, manifest)
    store.write_table(run_dir, "cases", cases_frame(cases))
    console.print(f"run [bold]{run_dir.name}[/]: {len(cases)} cases "
                  f"({len(exp.impl_names())} implementations x "
                  f"{len(cases) // max(1, len(exp.impl_names()))} shapes) on {dev}")
    _run(run_dir, console)
    return run_dir


def _run(run_dir: Path, console: Console) -> None:
    try:
        Runner(run_dir, console).run()
    except Interrupted:
        raise Interrupted(run_dir) from None


def resume(ref: str, *, out_root: str, console: Console) -> Path:
    run_dir = store.resolve_run(ref, out_root)
    m = store.load_manifest(run_dir)
    if m.get("status") == "complete":
        console.print(f"run {run_dir.name} is already complete")
        return run_dir
    dev, _ = detect_device(m["device"])
    store.update_manifest(run_dir, status="running")
    console.print(f"resuming run [bold]{run_dir.name}[/] on {dev}")
    _run(run_dir, console)
    return run_dir
