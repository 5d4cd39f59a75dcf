"""Which profiler process profiles which cases (a part of harness.execute.runner.Runner through
ProfilerPasses): the cases a pass profiles, and with several GPUs the deal of every pass's cases
onto them (harness.execute.executors.profiler_deal), with the inputs it weighs them by.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from harness import store
from harness.experiment import spec
from harness.execute import prewarm
from harness.execute.executors.profiler_deal import (PROFILE_CASE_S, case_prior_s, deal,
                                                     planned_ends)
from harness.execute.executors.schedule import PROFILE_SETUP_S, shard_by_impl
from harness.execute.previous import previous_profile_s
from harness.execute.profiler_early import measure_left_s

if TYPE_CHECKING:
    from harness.execute.profiler_pass import ProfilerPass

FAILED = ("error", "timeout", "skipped")


class ProfilerShards:
    """ProfilerPasses' choice of cases and their deal (needs run_dir, executor, timeline and
    plan() from Runner)."""

    def profile_cases(self, which, untimed: bool = False) -> list[str]:
        """The cases a profiler pass profiles (its `cases` option: "all", "first" or globs):
        those that ran, correct or not. `untimed` (profilers planned while a GPU still times,
        profilers_due): a checked case not timed yet counts; if its timing fails meanwhile, it
        is left out at its process's turn (unfailed)."""
        cases = store.load_cases(self.run_dir)
        ran = cases.status.isin(["ok", "failed"])
        if untimed:
            checked = {r["case_id"] for r in store.read_parts(self.run_dir, "check")
                       if r.get("status") in ("ok", "failed")}
            ran |= (cases.status == "pending") & cases.case_id.isin(checked)
        runnable = cases[ran]
        if which == "all":
            return list(runnable.case_id)
        if which == "first":
            first = runnable.shape_id.iloc[0] if len(runnable) else None
            return list(runnable[runnable.shape_id == first].case_id)
        return [r.case_id for r in runnable.itertuples()
                if any(spec.glob_matches(r.case_id, f"{r.impl}.{r.shape_id}", p) for p in which)]

    def _joint_shards(self, passes: "list[ProfilerPass]", gpus: list,
                      early: bool = False) -> list[list[tuple]]:
        """Per pass, its (gpu, case ids, out dir) shards when all `passes` share the GPUs
        (profiler_deal.deal): an implementation's cases under one pass are one unit, and
        a case weighs the seconds it took under that profiler in the previous run (the
        first case's warm-up included), else what its timed median predicts (case_prior_s),
        else a per-profiler prior (PROFILE_CASE_S) spread over the cases by their estimated
        cost, plus its first call's cost in a fresh process of this run
        (prewarm.load_seconds), else PROFILE_SETUP_S per unit. `early`: a GPU is busy for what
        its measure passes still take (measure_left_s)."""
        impl_of = store.load_cases(self.run_dir).set_index("case_id").impl.to_dict()
        _, est, _ = self.plan()
        units: dict[tuple[str, str], list[str]] = {}
        cost: dict[str, float] = {}  # keyed "pass|case": a case is in several passes
        load, setup, loads = {}, {}, prewarm.load_seconds(self.run_dir)  # case/unit/case -> s
        medians = {r["case_id"]: r.get("median_ms") for r in store.read_parts(self.run_dir, "time")
                   if r.get("status") == "ok"}
        for p in passes:
            seen = previous_profile_s(self.run_dir, p.name)
            mean = sum(est.get(c, 0.0) for c in p.cases) / max(1, len(p.cases)) or 1.0
            prior = PROFILE_CASE_S.get(p.name, PROFILE_CASE_S["default"])
            for c in p.cases:
                u, key = (p.name, impl_of.get(c, c)), f"{p.name}|{c}"
                units.setdefault(u, []).append(key)
                fit = case_prior_s(p.name, medians.get(c))
                cost[key] = (seen[c] if c in seen else fit if fit is not None
                             else prior * est.get(c, mean) / mean)
                if c not in seen and loads:
                    load[key] = loads.get(c, 0.0)
                elif c not in seen:
                    setup[u] = PROFILE_SETUP_S
        busy = (measure_left_s(self.run_dir, gpus, self.executor.planned, est)
                if early else None)
        how = dict(setup=setup, busy=busy, load=load, order=[p.name for p in passes])
        per_gpu = deal(units, cost, len(gpus), **how)
        at = time.monotonic() - self.timeline.t0  # the deal's expected ends, for `show`
        ends = planned_ends(per_gpu, units, cost, **how)
        plan = [{"gpu": g, "busy_s": round(busy[i] if busy else 0.0, 2),
                 "end_s": round(at + end, 2),
                 "cases": {p: len(ids) for p, ids in per_gpu[i].items()}}
                for i, (g, end) in enumerate(zip(gpus, ends))]
        store.update_manifest(self.run_dir, profiler_plan={"at_s": round(at, 2), "gpus": plan})
        out = []
        for p in passes:
            pos = {c: i for i, c in enumerate(p.cases)}
            out.append(self._with_dirs(p.name, [
                (g, sorted((k.split("|", 1)[1] for k in got.get(p.name, [])),
                           key=pos.__getitem__)) for g, got in zip(gpus, per_gpu)]))
        return out

    def _with_dirs(self, prof_name: str, parts: list[tuple]) -> list[tuple]:
        """(gpu, case ids) per process, empty ones dropped -> (gpu, case ids, out dir): one
        process writes raw/<prof>/ (as on one GPU), several raw/<prof>/gpu<i>/ each."""
        parts = [(g, ids) for g, ids in parts if ids]
        if len(parts) == 1:
            return [(*parts[0], store.raw_dir(self.run_dir, prof_name))]
        return [(g, ids, store.raw_dir(self.run_dir, prof_name, f"gpu{g}")) for g, ids in parts]

    def _profile_shards(self, prof_name: str, cases: list[str]) -> list[tuple]:
        """(gpu, case ids, out dir) per profiler process: one on one GPU, else an
        implementation's cases together on one GPU (an implementation heavier than a GPU's
        fair share split over several), out dirs as _with_dirs. A case weighs what it took
        under this profiler in the previous run, else its estimated cost."""
        gpus = self.executor.profiler_gpus()
        if len(gpus) <= 1 or len(cases) <= 1:
            return self._with_dirs(prof_name, [(gpus[0] if gpus else None, cases)])
        frame = store.load_cases(self.run_dir)
        impl_of = dict(zip(frame.case_id, frame.impl))
        _, cost, _ = self.plan()
        seen = previous_profile_s(self.run_dir, prof_name)
        weight = {c: seen[c] if c in seen else cost.get(c, 0.0) for c in cases}
        parts = shard_by_impl(cases, impl_of, weight, len(gpus))
        return self._with_dirs(prof_name, list(zip(gpus, parts)))

    def unfailed(self, ids: list[str]) -> list[str]:
        """`ids` less the cases whose timing has failed since they were dealt (a process's
        turn: profilers_due may deal a case before its first timing)."""
        failed = {r["case_id"] for r in store.read_parts(self.run_dir, "time")
                  if r.get("status") in FAILED}
        return [c for c in ids if c not in failed]
