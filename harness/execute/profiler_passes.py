"""The profiler passes of a run (ncu, nsys, or torch.profiler without nsys), as a part of
harness.execute.runner.Runner: each re-runs the chosen cases' `profile` pass in a worker wrapped
by the profiler, then exports, parses and merges what it measured into the run's metrics and
extra tables. On one GPU the passes run one after the other; with --gpus they share the GPUs:
every pass's cases are dealt onto them together, an implementation's cases of one pass in one
process (ncu on one GPU while nsys runs on another), a GPU running its processes in turn. Either
way a GPU's later processes start with its first and load their cases while it runs. On the GPU
runs of the local and --gpus executors the processes start before the measure passes end and
wait for them (harness.execute.profiler_early).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from rich.progress import Progress

from harness.machine import env as envmod
from harness import store
from harness.execute import profile_carry, sharing
from harness.execute.executors.process import (Interrupted, describe_rc, run_threads,
                                               stream, worker_argv, worker_env)
from harness.execute.profiler_early import Early, EarlyStart
from harness.execute.profiler_pass import CallStop, ProfilerPass
from harness.execute.profiler_shards import ProfilerShards

class ProfilerPasses(EarlyStart, ProfilerShards):
    """Runner's profiler passes (needs run_dir, exp, op, device, executor, passes, pass_wall,
    timeline, manifest, plan() and _set_pass() from Runner)."""

    def _profilers(self, progress: Progress, early: Early | None = None) -> None:
        if early is None and self._early is not None:
            self._finish_early()
            return
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
        todo = []
        if prof.ncu is not None and prof.ncu.enabled and not self._done("ncu"):
            todo.append(("ncu", prof.ncu))
        if prof.nsys is not None and prof.nsys.enabled and not self._done("nsys"):
            from harness.profilers.nsys import Nsys

            if Nsys().is_available():
                todo.append(("nsys", prof.nsys))
            else:
                self._set_pass("nsys", f"skipped: {Nsys().availability().detail}; "
                                       "kernel table from torch.profiler instead")
                todo.append(("torch_profiler", prof.nsys))
        self.profile_passes(progress, todo, early)

    def _done(self, name: str) -> bool:
        return self.passes.get(name, "").startswith(("done", "skipped"))

    def profile(self, progress: Progress, prof_name: str, options) -> None:
        """One profiler pass on its own (profile_passes)."""
        self.profile_passes(progress, [(prof_name, options)])

    def profile_passes(self, progress: Progress, todo: list[tuple[str, object]],
                       early: Early | None = None) -> None:
        """Run the profiler passes `todo` ([(name, options)], in order). With one GPU, one pass
        after the other. With several, side by side: every pass's processes are dealt onto
        the GPUs together (an implementation's cases of one pass in one process, a GPU running
        its processes in turn), so ncu on one GPU runs while nsys runs on another instead of
        each pass leaving a GPU idle through its start-up and its tail. `early`: every
        process, a GPU's first too, starts now and waits for its GPU's gate (start_early)."""
        passes = [p for p in (self._plan_pass(progress, name, opts, early is not None)
                              for name, opts in todo) if p]
        if not passes:  # all skipped or carried over
            return
        if store.load_manifest(self.run_dir).get("profiler_plan") is not None:
            store.update_manifest(self.run_dir, profiler_plan=None)  # an earlier deal's
        gpus = self.executor.profiler_gpus()
        if len(gpus) > 1 and (len(passes) > 1 or early is not None):
            started = time.monotonic()
            for p, shards in zip(passes, self._joint_shards(passes, gpus, early is not None)
                                 if len(passes) > 1
                                 else [self._profile_shards(p.name, p.cases) for p in passes]):
                p.shards = shards
            if early is not None:
                early.planned.set()
            # a shard's export starts when its process ends: on two H100s ncu's took 1.7 s,
            # after both GPUs' nsys processes, while it could have run beside them
            self._run_processes(passes, early, after=self._export_one)
            if early is not None:  # the passes' wall runs from the first turn
                started = min((p.span[0] for p in passes if p.span), default=started)
            self._export(passes)
            for p in passes:
                self._merge_pass(p, side_by_side=len(passes) > 1, early=early is not None)
            if len(passes) > 1:
                key = "+".join(p.name for p in passes)
                self.pass_wall[key] = round(time.monotonic() - started, 2)
            return
        for p in passes:  # one GPU: one pass after the other
            p.shards = self._profile_shards(p.name, p.cases)
        if early is not None:
            early.planned.set()
        if early is not None or len(passes) > 1 and all(len(p.shards) == 1 for p in passes):
            self._run_in_turn(passes, early)
            return
        for p in passes:
            self._run_processes([p])
            self._export([p])
            self._merge_pass(p)

    def _run_in_turn(self, passes: list[ProfilerPass], early: Early | None = None) -> None:
        """One process per pass on one GPU, in turn, each started with the first and waiting
        for its turn (worker `--wait-for`) before it profiles: its start-up (the profiler's,
        Python's, the imports) is over by then, and so are its cases' first calls (worker
        `--prewarm`: torch.compile graphs loaded, cuDNN plans made, kernels loaded), made
        while the pass before it runs, each with the GPU lock shared (harness.tuning.gpu_lock)
        while a profiled call holds it exclusively (Worker._warm_then_range): nothing of the
        waiting process runs on the GPU while ncu replays a kernel or nsys traces a range.
        A pass's report is exported while the next pass runs (_in_turn, as a GPU's processes
        with --gpus). `early`: the first process waits too, for the GPU's gate (start_early)."""
        stop = CallStop(early.stop if early is not None else None)
        try:
            self._in_turn([(p, 0) for p in passes], stop,
                          after=self._export_one,
                          go=early.gate(passes[0].shards[0][0]) if early is not None else None)
        except KeyboardInterrupt:
            raise Interrupted() from None
        finally:
            if early is None:  # else the runner's thread, once the measure passes are over
                sharing.clear(self.run_dir)
        if early is not None and early.stop.is_set():
            raise Interrupted()
        for p in passes:
            self._merge_pass(p, early=early is not None)

    def _one_process(self, p: ProfilerPass, i: int, stop: threading.Event,
                     wait_for: Path | None = None, shared_gpu: bool = False,
                     load_after: Path | None = None, prewarm: bool = True) -> None:
        """Shard `i` of pass `p` as a profiler process pinned to its GPU (with `wait_for`, the
        worker first calls its cases once (`--prewarm`, unless `prewarm` is off; after the
        file `load_after` exists, when given) and then waits for that file, its turn, before
        its first case; `shared_gpu`: the processes of a GPU take its GPU lock, _in_turn)."""
        from harness.tuning import gpu_lock

        gpu, ids, out_dir = p.shards[i]
        argv = p.prof.command(worker_argv(self.run_dir, "torch_profiler" if p.name ==
                                          "torch_profiler" else "profile", self.device, ids,
                                          tag=p.name,
                                          shard=f"gpu{gpu}" if len(p.shards) > 1 else None)
                              + ((["--load-after", str(load_after)] if load_after else [])
                                 + (["--prewarm"] if prewarm else [])
                                 + ["--wait-for", str(wait_for)] if wait_for else []),
                              out_dir, p.options)
        env = {**worker_env(self.device, gpu), **p.prof.env()}
        if shared_gpu:
            env[gpu_lock.ENV] = sharing.lock_path(self.run_dir, gpu)
        limit = p.options.timeout_s

        def expired() -> bool:  # a process waiting for its turn: its limit runs from the turn
            turn = p.turns.get(i)
            return stop.is_set() or bool(limit and turn is not None
                                         and time.monotonic() - turn > limit)

        began = time.monotonic()
        if wait_for is None:  # a waiting process's span starts at its turn (its giver marks it)
            p.mark()
        try:
            p.outcome[i] = stream(argv, env, out_dir / f"{p.name}.log", p.events(i),
                                  timeout=None if wait_for else limit,
                                  watchdog=expired if wait_for else stop.is_set)
        finally:
            if wait_for is None or p.turns.get(i) is not None:  # else it ran nothing
                p.ran(i, start := p.turns.get(i, began))
                self.timeline.add(f"{p.name}@gpu{gpu}" if self.executor.kind == "gpus"
                                  else p.name, start)
            p.cases_over(i).set()  # (a process that ended without its `end`, too)

    def _plan_pass(self, progress: Progress, prof_name: str, options,
                   untimed: bool = False) -> "ProfilerPass | None":
        from harness.profilers import registry

        prof = registry.get(prof_name)
        avail = prof.availability()
        if not avail.ok:
            self._set_pass(prof_name, f"skipped: {avail.detail}")
            return None
        cases = self.profile_cases(options.cases if hasattr(options, "cases") else "all", untimed)
        if not cases:
            self._set_pass(prof_name, "skipped: no runnable case to profile")
            return None
        # one report per pass: a pass stopped half-way (Ctrl-C, timeout) is redone whole,
        # not just for the cases its worker had not reached
        store.clear_parts(self.run_dir, prof_name)
        record, carry = profile_carry.plan(self.run_dir, prof_name, prof, avail.detail,
                                           options, self.op, cases)
        carried = set(carry.ids) if carry else set()
        cases = [c for c in cases if c not in carried]
        if not cases:  # every profile carried over: no profiler process
            self._land(prof_name, prof.source, [], {}, {**record, "wall_s": 0.0, "cases": 0},
                       [], carry)
            return None
        task = progress.add_task(prof_name, total=len(cases))
        options = prof.prepare(options, store.load_cases(self.run_dir), cases)
        p = ProfilerPass(prof_name, prof, options, cases, progress, task)
        p.record, p.carry = record, carry
        return p

    def _run_processes(self, passes: list[ProfilerPass], early: Early | None = None,
                       after: Callable[[ProfilerPass, int], None] | None = None) -> None:
        """Every shard of `passes` as a profiler process pinned to its GPU: one process at a
        time on a GPU (a GPU's later processes loading meanwhile: _in_turn), the GPUs
        side by side. Ctrl-C stops them all (Interrupted). `early`: a GPU's first process
        waits too, for its GPU's gate (start_early). `after(p, i)`: once shard i of pass p
        has ended (its export, while the GPU's later processes run)."""
        by_gpu: dict[object, list[tuple[ProfilerPass, int]]] = {}
        for p in passes:
            for i, (gpu, _ids, _out) in enumerate(p.shards):
                by_gpu.setdefault(gpu, []).append((p, i))

        # Ctrl-C or a lane's fault: every lane's process group is killed
        stop = CallStop(early.stop if early is not None else None)

        def one(p: ProfilerPass, i: int) -> None:
            self._one_process(p, i, stop)

        lanes = list(by_gpu.values())
        if len(lanes) == 1 and len(lanes[0]) == 1 and early is None:
            one(*lanes[0][0])  # in this thread: Ctrl-C reaches stream() itself
            self.gpu_idle(lanes[0][0][0].shards[lanes[0][0][1]][0])
            return

        def lane(jobs) -> None:
            gpu = jobs[0][0].shards[jobs[0][1]][0]
            if len(jobs) == 1 and early is None:
                one(*jobs[0])
                self.gpu_idle(gpu)  # its last cases of the run are done
                if after is not None and not stop.is_set():
                    after(*jobs[0])
                return
            # early: a GPU's turn comes when its own shard of the measure passes has ended
            self._in_turn(jobs, stop, after, go=early.gate(gpu) if early is not None else None)

        try:
            run_threads([threading.Thread(target=lane, args=(jobs,), daemon=True)
                         for jobs in lanes], stop)
        finally:
            if early is None:  # else the runner's thread, once the measure passes are over
                sharing.clear(self.run_dir)
        if early is not None and early.stop.is_set():
            raise Interrupted()

    def _in_turn(self, jobs: list[tuple[ProfilerPass, int]], stop: threading.Event,
                 after: Callable[[ProfilerPass, int], None] | None = None,
                 go: threading.Event | None = None) -> None:
        """One GPU's processes (shard i of pass p for each (p, i) of `jobs`), started together
        and run in turn, each after the first loading its cases meanwhile, under the GPU's
        lock; the next has its turn when a process's cases are done (its `end`: the profiler
        writes its report meanwhile), `after(p, i)` in a thread of its own once it has ended
        (its export, beside the GPU's later processes). `go` (start_early): every process
        starts now and waits; when `go` is set, the first has its turn and the others load
        their cases (not before: their calls would hold the time pass's timing off; on an
        H100 loading flash.yaml's cases beside its time pass made that pass 16 s longer)."""
        gpu = jobs[0][0].shards[jobs[0][1]][0]
        turns = [sharing.turn_file(self.run_dir, f"{p.name}.gpu{gpu}.{i}")
                 if k or go is not None else None for k, (p, i) in enumerate(jobs)]
        loads = [sharing.turn_file(self.run_dir, f"{p.name}.gpu{gpu}.{i}.load")
                 if k and go is not None else None for k, (p, i) in enumerate(jobs)]
        threads = [threading.Thread(target=self._one_process,
                                    args=(p, i, stop, turn, True, load, k > 0),
                                    name=f"profile-{p.name}-{i}", daemon=True)
                   for k, ((p, i), turn, load) in enumerate(zip(jobs, turns, loads))]
        for t in threads:
            t.start()
        exports: list[threading.Thread] = []

        def give(k: int) -> None:  # process k's turn: its span starts now
            p, i = jobs[k]
            p.turns[i] = time.monotonic()
            if threads[k].is_alive():  # (one that died waiting ran nothing)
                p.mark()
            sharing.give_turn(turns[k], self.unfailed(p.shards[i][1]))

        try:
            if go is not None:
                while not go.wait(0.2) and not stop.is_set():
                    pass
                if not stop.is_set():
                    give(0)
                    for load in loads[1:]:  # the later processes load their cases now
                        sharing.give_turn(load, [])
            for k, t in enumerate(threads):
                over = jobs[k][0].cases_over(jobs[k][1])
                while not over.wait(0.2) and not stop.is_set():
                    pass
                if stop.is_set():
                    break
                if k + 1 < len(jobs):  # its cases done: the next takes the GPU while this
                    give(k + 1)        # one's profiler writes its report
                else:  # the GPU's last cases of the run are done (Runner.gpu_idle)
                    self.gpu_idle(gpu)
                while t.is_alive() and not stop.is_set():
                    t.join(0.2)
                if stop.is_set():
                    break
                if after is not None:
                    exports.append(threading.Thread(target=after, args=jobs[k], daemon=True))
                    exports[-1].start()
        except BaseException:  # no process is left waiting for a turn that never comes
            stop.set()
            raise
        finally:
            for t in threads + exports:
                t.join()

    def _export(self, passes: list[ProfilerPass]) -> None:
        """Export and parse each shard's capture not exported yet (ProfilerPass.export), side
        by side (each shard is an ncu or nsys process of its own, and reading a large report
        takes seconds)."""
        jobs = [(p, i) for p in passes for i in range(len(p.shards)) if i not in p.finished]
        if jobs:
            with ThreadPoolExecutor(len(jobs)) as pool:
                list(pool.map(lambda job: self._export_one(*job), jobs))

    def _export_one(self, p: ProfilerPass, i: int) -> None:
        p.export(i, self.run_dir, self.timeline)

    def _merge_pass(self, p: ProfilerPass, side_by_side: bool = False, early: bool = False) -> None:
        prof_name = p.name
        ran = p.span[1] - p.span[0] if p.span else 0.0
        export_s = max((got["export_s"] for got in p.finished.values()), default=0.0)
        # to its last export's end (a shard exported while another process ran ends sooner)
        ends = [got["export_end"] for got in p.finished.values() if "export_end" in got]
        wall = max(ends) - p.span[0] if p.span and ends else ran + export_s
        self.pass_wall[prof_name] = round(wall, 2)
        p.progress.update(p.task, description=prof_name)

        frames, tables, states = [], {}, []
        for i, (_gpu, ids, out_dir) in enumerate(p.shards):
            log = out_dir / f"{prof_name}.log"
            rc, timed_out = p.outcome.get(i, (1, False))
            problem = _log_problem(prof_name, log.read_text(errors="replace")
                                   if log.exists() else "")
            if problem and "ERR_NVGPUCTRPERM" in problem:
                self._set_pass(prof_name, f"skipped: {problem}")
                return
            if timed_out:
                states.append(f"failed: timed out after {p.options.timeout_s:g} s (log: {log})")
            elif rc != 0:
                states.append(f"failed: exit {describe_rc(rc)}"
                              f"{': ' + problem if problem else ''} (log: {log})")
            got = p.finished[i]
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
        timing = {**p.record, "wall_s": round(wall, 2), "run_s": round(ran, 2),
                  "export_s": round(export_s, 2), "cases": len(p.cases),
                  **p.phases(), "per_case_s": p.per_case}
        if len(p.shards) > 1 or side_by_side:
            timing["gpus"] = {str(g): len(ids) for g, ids, _ in p.shards}
        if side_by_side:
            timing["side_by_side"] = True
        if early:  # its processes started before the measure passes ended (start_early)
            timing["started_early"] = True
        self._land(prof_name, p.prof.source, frames, tables, timing, states, p.carry)

    def _land(self, prof_name: str, source: str, frames: list, tables: dict, timing: dict,
              states: list[str], carry: "profile_carry.Carry | None") -> None:
        """Write a pass's metrics and tables, with the profiles it carried over (Carry), its
        record in the manifest's `profiler_wall_s`, and its state."""
        import pandas as pd

        if carry is not None:
            frames = [*frames, carry.rows]
            for name, table in carry.tables.items():
                tables.setdefault(name, []).append(table)
            timing["carried"] = {"from": carry.prev.name, "cases": len(carry.ids)}
        frames = [f for f in frames if len(f)]
        self._merge_metrics(source, pd.concat(frames, ignore_index=True) if frames
                            else pd.DataFrame(columns=store.METRIC_COLUMNS))
        for name, parts in tables.items():
            store.write_table(self.run_dir, name, pd.concat(parts, ignore_index=True))
        with store.MANIFEST_LOCK:  # read afresh: the runner's other thread writes it too
            walls = store.load_manifest(self.run_dir).get("profiler_wall_s", {})
            self.manifest = store.update_manifest(
                self.run_dir, profiler_wall_s={**walls, prof_name: timing})
        failed = [st for st in states if st.startswith("failed")]
        state = failed[0] if failed else (states[0] if states else "done")
        if carry is not None and state == "done":
            state = carry.state
        self._set_pass(prof_name, state)

    def _merge_metrics(self, source: str, df) -> None:
        import pandas as pd

        old = store.load_metrics(self.run_dir)
        frames = [f for f in ((old[old.source != source] if len(old) else old), df) if len(f)]
        store.write_table(self.run_dir, "metrics",
                          pd.concat(frames, ignore_index=True) if frames else df)


def _log_problem(prof_name: str, text: str) -> str | None:
    from harness.profilers.ncu import check_log

    return check_log(text) if prof_name == "ncu" else None
