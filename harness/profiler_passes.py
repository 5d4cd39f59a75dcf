"""The profiler passes of a run (ncu, nsys, or torch.profiler without nsys), as a part of
harness.runner.Runner: each re-runs the chosen cases' `profile` pass in a worker wrapped by the
profiler (one process per GPU with --gpus, each taking whole implementations), then exports,
parses and merges what it measured into the run's metrics and extra tables.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.progress import Progress

from harness import env as envmod
from harness import spec, store
from harness.executors.process import describe_rc, stream, worker_argv, worker_env
from harness.executors.schedule import shard_by_impl
from harness.previous import previous_profile_s


class ProfilerPasses:
    """Runner's profiler passes (needs run_dir, exp, device, executor, passes, pass_wall,
    manifest, plan() and _set_pass() from Runner)."""

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
        ran = time.monotonic() - started
        progress.update(task, description=f"{prof_name} export")

        def finish(shard: tuple) -> dict:
            """Export and parse one shard's capture (shards side by side: each is an ncu or
            nsys process of its own, and reading a large report takes seconds)."""
            _gpu, ids, out_dir = shard
            got: dict = {"frame": None, "tables": {}, "error": None, "tables_error": None}
            try:
                if prof_name == "torch_profiler":
                    self._write_torch_profiler_kernels(out_dir, ids)
                prof.export(out_dir)
                got["frame"] = prof.parse(out_dir)
            except Exception as exc:  # keep the timing results and the raw files whatever happens
                got["error"] = exc
                return got
            try:  # tables besides metrics (ncu: source lines); a failure costs only them
                got["tables"] = prof.extra_tables(out_dir)
            except Exception as exc:
                got["tables_error"] = exc
            return got

        with ThreadPoolExecutor(len(shards)) as pool:
            finished = list(pool.map(finish, shards))
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
            got = finished[i]
            if got["error"] is not None:
                exc = got["error"]
                self._set_pass(prof_name, f"failed: {type(exc).__name__}: {exc}")
                return
            frames.append(got["frame"])
            for name, table in got["tables"].items():
                tables.setdefault(name, []).append(table)
            if got["tables_error"] is not None:
                exc = got["tables_error"]
                states.append(f"done (source lines failed: {type(exc).__name__}: {exc})")
        import pandas as pd

        frames = [f for f in frames if len(f)]
        self._merge_metrics(prof.source, pd.concat(frames, ignore_index=True) if frames
                            else pd.DataFrame(columns=store.METRIC_COLUMNS))
        for name, parts in tables.items():
            store.write_table(self.run_dir, name, pd.concat(parts, ignore_index=True))
        timing = {"wall_s": round(wall, 2), "run_s": round(ran, 2),
                  "export_s": round(wall - ran, 2), "cases": len(cases), "per_case_s": per_case}
        if len(shards) > 1:
            timing["gpus"] = {str(g): len(ids) for g, ids, _ in shards}
        self.manifest = store.update_manifest(
            self.run_dir, profiler_wall_s={**self.manifest.get("profiler_wall_s", {}),
                                           prof_name: timing})
        failed = [st for st in states if st.startswith("failed")]
        self._set_pass(prof_name, failed[0] if failed else (states[0] if states else "done"))

    def _profile_shards(self, prof_name: str, cases: list[str]) -> list[tuple]:
        """(gpu, case ids, out dir) per profiler process: one on one GPU (raw/<prof>/), else an
        implementation's cases together on one GPU (an implementation heavier than a GPU's
        fair share split over several), each GPU writing raw/<prof>/gpu<i>/. A case weighs
        what it took under this profiler in the previous run, else its estimated cost."""
        out_dir = store.raw_dir(self.run_dir, prof_name)
        gpus = self.executor.profiler_gpus()
        if len(gpus) <= 1 or len(cases) <= 1:
            return [(gpus[0] if gpus else None, cases, out_dir)]
        frame = store.load_cases(self.run_dir)
        impl_of = dict(zip(frame.case_id, frame.impl))
        _, cost, _ = self.plan()
        seen = previous_profile_s(self.run_dir, prof_name)
        weight = {c: seen[c] if c in seen else cost.get(c, 0.0) for c in cases}
        parts = shard_by_impl(cases, impl_of, weight, len(gpus))
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


def _log_problem(prof_name: str, text: str) -> str | None:
    if prof_name == "ncu":
        from harness.profilers.ncu import check_log

        return check_log(text)
    return None
