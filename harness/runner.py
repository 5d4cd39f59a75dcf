"""Orchestrates a run: spec -> run dir -> worker passes (check, time, ncu, nsys) -> tables.

The orchestrator never initialises CUDA: every pass runs in `python -m harness worker`, wrapped
by ncu/nsys for the profiler passes. A worker that dies (illegal address, segfault) costs the
case in flight, which is recorded as an error; a new worker carries on from the next case.
Ctrl-C leaves a readable partial run (status `interrupted`); `harness run --resume RUN` ends it.
"""
from __future__ import annotations

import math
import random
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness import env as envmod
from harness import spec, store
from harness.errors import HarnessError
from harness.executors import Executor, make_executor
from harness.executors.base import from_manifest
from harness.executors.process import (Interrupted, describe_rc, stream, todo, worker_argv,
                                       worker_env)
from harness.executors.schedule import (case_costs, case_timeout_s, longest_first,
                                        shard_by_impl)
from harness.registry import get_op
from harness.results import cases_frame, consolidate

MEASURE_PASSES = ("check", "time")
PASS_ORDER = ("compile", "check", "time", "check+time", "ncu", "nsys", "torch_profiler")


class Runner:
    def __init__(self, run_dir: Path, console: Console, executor: Executor | None = None):
        self.run_dir = Path(run_dir)
        self.console = console
        self.manifest = store.load_manifest(self.run_dir)
        self.executor = executor or from_manifest(self.manifest)
        # a resumed run keeps the walls of passes it does not redo; total is this invocation's
        self.pass_wall: dict[str, float] = dict(self.manifest.get("pass_wall_s") or {})
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
        return todo(self.run_dir, pass_name, self._case_ids())

    # -- measure passes (check, time), on the executor ---------------------------------------------
    def plan(self) -> tuple[list[str], dict[str, float], dict[str, float]]:
        """Cases longest first, their estimated cost (s) and their watchdog limits (s)."""
        cases = store.load_cases(self.run_dir)
        cost = case_costs(cases, self.op, self.exp.timing, self.device,
                          previous_medians(self.run_dir), self.exp.correctness.trials)
        limits = {c: case_timeout_s(v, self.exp.timing) for c, v in cost.items()}
        return longest_first(list(cases.case_id), cost), cost, limits

    def measure(self, progress: Progress) -> None:
        tasks = {}
        for p in MEASURE_PASSES:
            total = len(self._case_ids())
            tasks[p] = progress.add_task(p, total=total, completed=total - len(self._todo(p)))
        span: dict[str, list[float]] = {}
        t0 = time.monotonic()

        def on_event(ev):
            name, now = ev.get("name"), time.monotonic()
            if name not in tasks:
                return
            first = span.setdefault(name, [now, now])
            first[1] = now
            if ev["event"] == "start":
                where = f" [gpu {ev['gpu']}]" if ev.get("gpu") is not None else ""
                progress.update(tasks[name], description=f"{name}{where} {ev['case_id']}")
            elif ev["event"] == "done":
                progress.advance(tasks[name])

        if not self.manifest.get("retune") and "tuner_picks_from" not in self.manifest:
            from harness.previous import inherit_picks

            try:
                source = inherit_picks(self.run_dir, self.op)
            except HarnessError:  # an unreadable earlier run: this one tunes, as with none
                source = None
            self.manifest = store.update_manifest(self.run_dir, tuner_picks_from=source)
        order, cost, limits = self.plan()
        left = set().union(*(self._todo(p) for p in MEASURE_PASSES))
        todo_ids = [c for c in order if c in left]
        unchecked = set(self._todo("check"))
        self.compile_ahead(progress, [c for c in order if c in unchecked], limits)
        t0 = time.monotonic()
        if todo_ids:
            self.executor.measure(self.run_dir, todo_ids, cost, limits, self.device, on_event)
        # the check pass starts with the first worker (its start-up is part of the pass)
        if "check" in span:
            span["check"][0] = t0
        if self.executor.kind == "ray":  # a task does both passes of its cases: one number
            self.pass_wall["check+time"] = round(time.monotonic() - t0, 2)
        elif todo_ids:  # spans from the workers' events (with --gpus the spans overlap)
            self.pass_wall.update({p: round(b - a, 2) for p, (a, b) in span.items()})
        for p in MEASURE_PASSES:
            progress.update(tasks[p], description=p)
            self._set_pass(p, "done")

    def compile_ahead(self, progress: Progress, check_ids: list[str],
                      limits: dict[str, float]) -> None:
        """Warm the kernel caches for the check pass (harness.executors.warm): GPU runs of the
        local and --gpus executors, cases of implementations that JIT-compile."""
        if (self.device != "cuda" or not self.exp.timing.compile_ahead
                or self.executor.kind not in ("local", "gpus") or not check_ids):
            return
        from harness.executors.warm import compile_ahead
        from harness.previous import compiled_before
        from harness.worker import WARM_BACKENDS, _registered_impl

        frame = store.load_cases(self.run_dir)
        base = {r.case_id: _registered_impl(r) for r in frame.itertuples()}
        ids = [c for c in check_ids if self._backend(base.get(c)) in WARM_BACKENDS]
        cached = compiled_before(self.run_dir, {c: base[c] for c in ids}, self.op)
        ids = [c for c in ids if c not in cached]
        if cached:
            self.manifest = store.update_manifest(
                self.run_dir, compile_ahead={"skipped": len(cached), "why": "checked on this "
                                             "host by the previous run with the same code"})
        if not ids:
            return
        task = progress.add_task("compile", total=len(ids))

        def on_event(ev):
            if ev.get("name") != "warm":
                return
            if ev["event"] == "start":
                progress.update(task, description=f"compile {ev['case_id']}")
            elif ev["event"] == "done":
                progress.advance(task)

        gpus = getattr(self.executor, "gpus", None) or [None]
        out = compile_ahead(self.run_dir, ids, device=self.device, limits=limits, gpus=gpus,
                            on_event=on_event)
        progress.update(task, description="compile", completed=len(ids))
        if out["workers"]:
            self.pass_wall["compile"] = out["wall_s"]
            self.manifest = store.update_manifest(self.run_dir, compile_ahead={
                **out, "skipped": len(cached)})

    def _backend(self, impl: str | None) -> str | None:
        try:
            return self.op.get_impl(impl).backend if impl else None
        except Exception:  # an impl the registry no longer has: the check pass says so
            return None

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
        return [r.case_id for r in runnable.itertuples()
                if any(spec.glob_matches(r.case_id, f"{r.impl}.{r.shape_id}", p) for p in which)]

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
        # one report per pass: a pass stopped half-way (Ctrl-C, timeout) is redone whole,
        # not just for the cases its worker had not reached
        store.clear_parts(self.run_dir, prof_name)
        task = progress.add_task(prof_name, total=len(cases))
        options = prof.prepare(options, store.load_cases(self.run_dir), cases)
        shards = self._profile_shards(prof_name, cases)

        per_case: dict[str, float] = {}
        began: dict[str, float] = {}
        lock = threading.Lock()

        def on_event(ev):  # per-case wall time under the profiler (replay passes included)
            with lock:
                if ev["event"] == "start":
                    began[ev["case_id"]] = time.monotonic()
                    progress.update(task, description=f"{prof_name} {ev['case_id']}")
                elif ev["event"] == "done":
                    per_case[ev["case_id"]] = round(time.monotonic() - began[ev["case_id"]], 2)
                    progress.advance(task)

        started = time.monotonic()
        outcome: dict[int, tuple[int, bool]] = {}

        def one(i: int, gpu, ids: list[str], out_dir: Path):
            argv = prof.command(worker_argv(self.run_dir, "torch_profiler" if prof_name ==
                                            "torch_profiler" else "profile", self.device, ids,
                                            tag=prof_name,
                                            shard=f"gpu{gpu}" if len(shards) > 1 else None),
                                out_dir, options)
            env = {**worker_env(self.device, gpu), **prof.env()}
            outcome[i] = stream(argv, env, out_dir / f"{prof_name}.log", on_event,
                                timeout=options.timeout_s)

        if len(shards) == 1:
            one(0, *shards[0])
        else:  # one profiler process per GPU, side by side
            interrupted: list[BaseException] = []

            def guarded(i, *args):
                try:
                    one(i, *args)
                except BaseException as exc:  # Interrupted: re-raised below
                    interrupted.append(exc)

            threads = [threading.Thread(target=guarded, args=(i, *sh), daemon=True)
                       for i, sh in enumerate(shards)]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
            if interrupted:
                raise interrupted[0]
        wall = time.monotonic() - started
        self.pass_wall[prof_name] = round(wall, 2)
        progress.update(task, description=prof_name)

        frames, tables, states = [], {}, []
        for i, (_gpu, ids, out_dir) in enumerate(shards):
            log = out_dir / f"{prof_name}.log"
            rc, timed_out = outcome.get(i, (1, False))
            problem = _log_problem(prof_name, log.read_text(errors="replace")
                                   if log.exists() else "")
            if problem and "ERR_NVGPUCTRPERM" in problem:
                self._set_pass(prof_name, f"skipped: {problem}")
                return
            if timed_out:
                states.append(f"failed: timed out after {options.timeout_s:g} s (log: {log})")
            elif rc != 0:
                states.append(f"failed: exit {describe_rc(rc)}"
                              f"{': ' + problem if problem else ''} (log: {log})")
            try:
                if prof_name == "torch_profiler":
                    self._write_torch_profiler_kernels(out_dir, ids)
                prof.export(out_dir)
                frames.append(prof.parse(out_dir))
            except Exception as exc:  # keep the timing results and the raw files whatever happens
                self._set_pass(prof_name, f"failed: {type(exc).__name__}: {exc}")
                return
            try:  # tables besides metrics (ncu: source lines); a failure costs only them
                for name, table in prof.extra_tables(out_dir).items():
                    tables.setdefault(name, []).append(table)
            except Exception as exc:
                states.append(f"done (source lines failed: {type(exc).__name__}: {exc})")
        import pandas as pd

        frames = [f for f in frames if len(f)]
        self._merge_metrics(prof.source, pd.concat(frames, ignore_index=True) if frames
                            else pd.DataFrame(columns=store.METRIC_COLUMNS))
        for name, parts in tables.items():
            store.write_table(self.run_dir, name, pd.concat(parts, ignore_index=True))
        timing = {"wall_s": round(wall, 2), "cases": len(cases), "per_case_s": per_case}
        if len(shards) > 1:
            timing["gpus"] = {str(g): len(ids) for g, ids, _ in shards}
        self.manifest = store.update_manifest(
            self.run_dir, profiler_wall_s={**self.manifest.get("profiler_wall_s", {}),
                                           prof_name: timing})
        failed = [st for st in states if st.startswith("failed")]
        self._set_pass(prof_name, failed[0] if failed else (states[0] if states else "done"))

    def _profile_shards(self, prof_name: str, cases: list[str]) -> list[tuple]:
        """(gpu, case ids, out dir) per profiler process: one on one GPU (raw/<prof>/), else an
        implementation's cases together on one GPU, each GPU writing raw/<prof>/gpu<i>/."""
        out_dir = store.raw_dir(self.run_dir, prof_name)
        gpus = self.executor.profiler_gpus()
        if len(gpus) <= 1 or len(cases) <= 1:
            return [(gpus[0] if gpus else None, cases, out_dir)]
        frame = store.load_cases(self.run_dir)
        impl_of = dict(zip(frame.case_id, frame.impl))
        _, cost, _ = self.plan()
        parts = shard_by_impl(cases, impl_of, cost, len(gpus))
        return [(g, ids, store.raw_dir(self.run_dir, prof_name, f"gpu{g}"))
                for g, ids in zip(gpus, parts) if ids]

    def _write_torch_profiler_kernels(self, out_dir: Path, ids: list[str]) -> None:
        from harness.profilers.torch_profiler import KERNELS_FILE

        recs = store.read_parts(self.run_dir, "torch_profiler")
        keep = set(ids)
        per_case = {r["case_id"]: r.get("kernels", []) for r in recs
                    if r["status"] == "ok" and r["case_id"] in keep}
        store.write_json(out_dir / KERNELS_FILE, per_case)

    def _merge_metrics(self, source: str, df) -> None:
        import pandas as pd

        old = store.load_metrics(self.run_dir)
        old = old[old.source != source] if len(old) else old
        frames = [f for f in (old, df) if len(f)]
        merged = pd.concat(frames, ignore_index=True) if frames else df
        store.write_table(self.run_dir, "metrics", merged)

    # -- the whole run ----------------------------------------------------------------------------
    def run(self) -> None:
        t0 = time.monotonic()
        with Progress(TextColumn("{task.description:<60.60}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=self.console, transient=False) as progress:
            try:
                self.measure(progress)
                consolidate(self.run_dir, self.op)
                self._profilers(progress)
            except Interrupted:
                consolidate(self.run_dir, self.op)
                store.update_manifest(self.run_dir, status="interrupted",
                                      executor=self.executor.describe())
                raise
        self.finish()
        self.pass_wall["total"] = round(time.monotonic() - t0, 2)
        self.manifest = store.update_manifest(self.run_dir, pass_wall_s=self.pass_wall,
                                              executor=self.executor.describe())

    def _profilers(self, progress: Progress) -> None:
        prof = self.exp.profile
        if self.device != "cuda":
            for name, opts in (("ncu", prof.ncu), ("nsys", prof.nsys)):
                if opts is not None and opts.enabled:
                    self._set_pass(name, "skipped: no CUDA device (ncu and nsys need an "
                                         "NVIDIA GPU)")
            return
        if self.executor.kind == "ray" and not envmod.cuda_device_present()[0]:
            for name, opts in (("ncu", prof.ncu), ("nsys", prof.nsys)):
                if opts is not None and opts.enabled:
                    self._set_pass(name, "skipped: the Ray driver has no GPU (the profiler "
                                         "passes run on the driver's first GPU)")
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
        from harness.analysis import pairing

        pairing.record(self.run_dir)  # the previous comparable run: `show`'s since block


def wall_line(walls: dict[str, float]) -> str:
    """`wall: check 41.2 s · time 33.0 s · ncu 20.1 s · nsys 25.3 s · total 130.4 s` (shown
    by `show` at the end of a run; stored as the manifest's pass_wall_s)."""
    keys = [k for k in PASS_ORDER if k in walls] + ["total"]
    return "wall: " + " · ".join(f"{k} {walls[k]:.1f} s" for k in keys if k in walls)


def previous_medians(run_dir: Path) -> dict[str, float]:
    """case_id -> median ms in the latest other run of the same experiment under the same root
    (the scheduler's best estimate of what a case costs); {} when there is none."""
    m = store.load_manifest(run_dir)
    name = (m.get("experiment") or {}).get("name")
    for row in reversed(store.list_runs(Path(run_dir).parent)):
        if row["run_id"] == Path(run_dir).name or row.get("error"):
            continue
        if row.get("experiment") != name or row.get("device") != m.get("device"):
            continue
        try:
            res = store.load_results(row["path"])
        except HarnessError:
            continue
        if "median_ms" in res.columns and len(res):
            return {c: float(v) for c, v in zip(res.case_id, res.median_ms)
                    if v is not None and math.isfinite(float(v))}
    return {}


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
          device: str | None, console: Console, argv: list[str], gpus: str | None = None,
          ray: str | None = None, against: str | None = None, retune: bool = False) -> Path:
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
        "against": asked.as_dict() if asked else None,  # None: found at the end of the run
        "retune": retune,  # True: no Tuner pick taken over from the previous run
    }
    run_dir = store.create_run(out_root, exp.name, manifest)
    store.write_table(run_dir, "cases", cases_frame(cases))
    console.print(f"run [bold]{run_dir.name}[/]: {len(cases)} cases "
                  f"({len(exp.impl_names())} implementations x "
                  f"{len(cases) // max(1, len(exp.impl_names()))} shapes) on {dev}"
                  f"{_where(executor)}")
    _run(run_dir, console, executor)
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


def _run(run_dir: Path, console: Console, executor: Executor | None = None) -> None:
    try:
        Runner(run_dir, console, executor).run()
    except Interrupted:
        raise Interrupted(run_dir) from None


def resume(ref: str, *, out_root: str, console: Console, gpus: str | None = None,
           ray: str | None = None, against: str | None = None) -> Path:
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
    _run(run_dir, console, executor)
    return run_dir
