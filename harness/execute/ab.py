"""`python -m harness ab EXPERIMENT --base REV [--head REV]`: did my change help, measured
with both versions side by side.

The base version of the experiment's op is commit REV of the repository its module lives in
(`kernels/` here, or a $HARNESS_OPS module in your own repository), extracted and imported as a
package of its own (harness.execute.code_tree); the head is the working tree (or `--head REV`).
One worker process (harness.execute.ab_worker) checks both versions of each case, and times
those where both are correct interleaved on the same GPU and inputs
(harness.execute.interleave); the statistic is the paired ratio head/base with its 95 % CI and
the case's minimum detectable effect (analysis.paired). The output is a pair of ordinary runs in
the store, base then head, with the head run's `ab.parquet` holding the rounds: `show`, `compare
BASE HEAD`, `report HEAD --against BASE` and the dashboard read them, and judge the pair by its
rounds. `--ncu` then profiles the named cases of both versions (the usual ncu pass, once per
run) and prints their counters and hottest source lines side by side.

The verb's parser is here; its main (measure, then show) is harness.present.ab_show.main.
Exit code 0, or 1 with `--fail-on-regression PCT` when a case is marked slower by more than PCT.
"""
from __future__ import annotations

import argparse
import random
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from harness.store.option import add_store_argument

HELP = ("time two versions of an experiment's implementations side by side: a commit (--base) "
        "against the working tree, interleaved in one process")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", help="experiment YAML (e.g. experiments/softmax.yaml)")
    p.add_argument("--base", required=True, metavar="REV",
                   help="the commit the working tree is measured against (e.g. HEAD, HEAD~1)")
    p.add_argument("--head", default=None, metavar="REV",
                   help="measure this commit instead of the working tree")
    p.add_argument("--cases", default=None, help="comma-separated globs over case ids")
    p.add_argument("--smoke", action="store_true", default=None,
                   help="use the experiment's smoke: overrides (automatic without a GPU)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="force a device (default: cuda when a GPU is present)")
    add_store_argument(p, out_alias=True)
    p.add_argument("--ncu", nargs="?", const="", default=None, metavar="CASES",
                   help="also profile both versions under ncu: the cases matching these "
                        "globs (default: the experiment's profile.ncu.cases)")
    p.add_argument("--fail-on-regression", metavar="PCT", default=None,
                   help="exit 1 when a case is marked slower by more than PCT (e.g. 2%%)")
    p.add_argument("--min-effect", metavar="PCT", default=None,
                   help="the smallest change marked faster/slower (default 0.5%%)")


def measure(a, console, min_effect: float) -> "Pair | None":
    """Create, measure and finish the pair (and profile it with --ncu); None when interrupted
    (the pair is stored as it stands). harness.present.ab_show shows it: the verb's main."""
    from harness.execute.executors.process import Interrupted

    signal.signal(signal.SIGTERM, _sigterm)
    pair = Pair.create(a, min_effect, console)
    try:
        pair.measure(console)
        pair.finish(console)
        if a.ncu is not None:
            pair.profile(a.ncu, console)
    except (KeyboardInterrupt, Interrupted):  # Ctrl-C, SIGTERM; a worker's stream re-raises
        pair.stopped()
        console.print("[yellow]interrupted[/]: the pair is stored as it stands (status "
                      "interrupted); run `harness ab` again to measure it afresh")
        return None
    return pair


def _sigterm(signum, frame):
    raise KeyboardInterrupt


class Pair:
    """The two runs of one `harness ab`: created, measured, finished, profiled."""

    def __init__(self, base_dir: Path, head_dir: Path, device: str):
        self.base_dir, self.head_dir, self.device = base_dir, head_dir, device
        self.walls: dict[str, float] = {}
        self.t0 = time.monotonic()

    @classmethod
    def create(cls, a, min_effect: float, console) -> "Pair":
        """Validate everything (nothing is written on a user error but the extracted trees),
        then write the base run and the head run."""
        from harness import op_card, store
        from harness.experiment import spec
        from harness.execute import runner
        from harness.execute import code_tree
        from harness.registry import get_op
        from harness.analysis.pairing import Against
        from harness.execute.executors.local import LocalExecutor
        from harness.execute.executors.process import kernel_caches
        from harness.store.results import cases_frame

        exp = spec.load(a.experiment)
        dev, why = runner.detect_device(a.device)
        use_smoke = bool(a.smoke) or (dev == "cpu" and a.smoke is None and exp.smoke is not None)
        cases = spec.select(spec.expand(exp, smoke=use_smoke), a.cases)
        base_tree = code_tree.materialise(exp.op, a.base, a.store, "--base")
        head_tree = code_tree.materialise(exp.op, a.head, a.store, "--head") if a.head else None
        # a commit whose module does not import: exit 2 now
        base_op = code_tree.load_op(base_tree)
        head_op = code_tree.load_op(head_tree) if head_tree is not None else get_op(exp.op)
        if dev == "cpu":
            console.print(f"[yellow]No CUDA device ({why}):[/] both versions on the CPU, "
                          "Triton through the interpreter: CPU timings are not judged.")
        executor = LocalExecutor()
        env = runner._run_env(dev, executor)
        now = datetime.now(timezone.utc).isoformat()
        common = {
            "experiment": exp.model_dump(mode="json"), "experiment_path": str(a.experiment),
            "spec_hash": spec.spec_hash(exp), "device": dev, "smoke": use_smoke,
            "cases_filter": a.cases, "seed": random.SystemRandom().randrange(2 ** 31),
            "status": "running", "passes": {}, "command": ["python", "-m", "harness",
                                                           *sys.argv[1:]],
            "created_utc": now, "executor": executor.describe(),
            "driver": store.driver_record(), "retune": False, "profile_harness": False,
            "kernel_caches": kernel_caches(),
        }
        base = store.create_run(a.store, exp.name, {
            **common, "env": _tree_env(env, base_tree), "code_tree": base_tree,
            op_card.KEY: op_card.card(base_op),
            "ab": {"role": "base", "rev": a.base, "sha": base_tree["sha"],
                   "min_effect": min_effect}})
        head_env = _tree_env(env, head_tree) if head_tree else env
        head = store.create_run(a.store, exp.name, {
            **common, "env": head_env, **({"code_tree": head_tree} if head_tree else {}),
            op_card.KEY: op_card.card(head_op),
            "created_utc": datetime.now(timezone.utc).isoformat(),
            "ab": {"role": "head", "rev": a.head or "working tree",
                   "sha": head_tree["sha"] if head_tree else None, "base_run": base.name,
                   "base_path": str(base.resolve()), "base_rev": a.base,
                   "base_sha": base_tree["sha"], "min_effect": min_effect},
            "against": Against(base.name, "explicit", f"harness ab: the base of this pair "
                               f"({a.base} = {base_tree['sha'][:12]})",
                               str(base.resolve())).as_dict()})
        store.update_manifest(base, ab={**store.load_manifest(base)["ab"],
                                        "head_run": head.name,
                                        "head_path": str(head.resolve())},
                              against=Against(None, "none", f"harness ab: the base of the "
                                              f"pair with {head.name}").as_dict())
        for run_dir in (base, head):
            store.write_table(run_dir, "cases", cases_frame(cases))
        console.print(f"ab: {len(cases)} cases, base {a.base} ({base_tree['sha'][:12]}) in "
                      f"run [bold]{base.name}[/], head {a.head or 'the working tree'} in run "
                      f"[bold]{head.name}[/], on {dev}")
        return cls(base, head, dev)

    def measure(self, console) -> None:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        from harness import store

        from harness.experiment import spec
        from harness.execute.code_tree import op_for
        from harness.execute.executors.process import Driver
        from harness.execute.executors.schedule import case_costs, case_timeout_s, longest_first
        from harness.execute.compile_phase import progress_events

        m = store.load_manifest(self.head_dir)
        exp = spec.Experiment.model_validate(m["experiment"])
        cases = store.load_cases(self.head_dir)
        cost = case_costs(cases, op_for(m), exp.timing, self.device, {},
                          exp.correctness.trials)
        limits = {c: 2 * case_timeout_s(v, exp.timing) for c, v in cost.items()}
        order = longest_first(list(cases.case_id), cost, store.shapes(self.head_dir))
        with Progress(TextColumn("{task.description:<60.60}"), BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=console) as progress:
            if self.device == "cuda" and exp.timing.compile_ahead:
                self._compile_ahead(order, limits, progress)
            t0 = time.monotonic()
            task = progress.add_task("ab", total=len(order))
            Driver(self.head_dir, device=self.device, limits=limits,
                   log_path=store.raw_dir(self.head_dir, "logs") / "ab.log",
                   on_event=progress_events(progress, task, "ab", "ab"),
                   gpu=None, shard=None, env=None, stop=None).run(order, ("ab",), None)
            progress.update(task, description="ab")
        self.walls["ab"] = round(time.monotonic() - t0, 2)
        self._settle()

    def _compile_ahead(self, order: list[str], limits: dict, progress) -> None:
        """Both versions' JIT-compiled cases compiled ahead, as `run` does before its check
        pass (harness.execute.executors.warm): the ab worker then finds the kernel caches warm."""
        from harness import store
        from harness.execute.code_tree import op_for
        from harness.execute.executors.warm import compile_ahead, compile_units, warm_cases
        from harness.execute.compile_phase import progress_events

        t0 = time.monotonic()
        for run_dir in (self.head_dir, self.base_dir):
            op = op_for(store.load_manifest(run_dir))
            ids, _ = warm_cases(run_dir, op, order)
            if not ids:
                continue
            label = f"compile ({run_dir.name[-4:]})"
            task = progress.add_task(label, total=len(ids))
            out = compile_ahead(run_dir, ids, device=self.device, limits=limits, gpus=[None],
                                on_event=progress_events(progress, task, "warm", label),
                                units=compile_units(run_dir, op, ids))
            store.update_manifest(run_dir, compile_ahead=out)
        self.walls["compile"] = round(time.monotonic() - t0, 2)

    def _settle(self) -> None:
        """A case whose worker died (or timed out) has only its `ab` record: both runs get
        the same error as their check and time records."""
        from harness import store

        for rec in store.read_parts(self.head_dir, "ab"):
            if rec["status"] not in ("error", "timeout"):
                continue
            for run_dir in (self.base_dir, self.head_dir):
                for part in ("check", "time"):
                    if not any(r["case_id"] == rec["case_id"]
                               for r in store.read_parts(run_dir, part)):
                        store.append_part(run_dir, part, {
                            "case_id": rec["case_id"], "status": rec["status"],
                            "error": f"ab: {rec.get('error')}"})

    def finish(self, console) -> None:
        import pandas as pd

        from harness import store
        from harness.execute.runner import Runner

        rows = [{"case_id": r["case_id"], **x} for r in store.read_parts(self.head_dir, "ab")
                if r.get("status") == "ok" for x in r.get("rounds") or []]
        store.write_table(self.head_dir, "ab", pd.DataFrame(rows, columns=store.AB_COLUMNS))
        for run_dir in (self.base_dir, self.head_dir):
            store.update_manifest(run_dir, passes={"check": "done",
                                                   "time": "done (harness ab: interleaved)"})
            Runner(run_dir, console).finish()
        self.walls["total"] = round(time.monotonic() - self.t0, 2)
        for run_dir in (self.base_dir, self.head_dir):
            store.update_manifest(run_dir, pass_wall_s=dict(self.walls))

    def profile(self, patterns: str, console) -> None:
        from rich.progress import Progress

        from harness import store

        from harness.experiment import spec
        from harness.execute.runner import Runner
        from harness.experiment.spec import NcuOptions

        if self.device != "cuda":
            console.print("ncu: skipped: no CUDA device (ncu needs an NVIDIA GPU)")
            return
        exp = spec.Experiment.model_validate(store.load_manifest(self.head_dir)["experiment"])
        opts = exp.profile.ncu or NcuOptions()
        cases = spec.split_patterns(patterns) if patterns else opts.cases
        opts = opts.model_copy(update={"cases": cases, "enabled": True})
        t0 = time.monotonic()
        for run_dir in (self.base_dir, self.head_dir):
            r = Runner(run_dir, console)
            with Progress(console=console, transient=True) as progress:
                r.profile(progress, "ncu", opts)
            r.finish()
        self.walls["ncu"] = round(time.monotonic() - t0, 2)
        self.walls["total"] = round(time.monotonic() - self.t0, 2)
        for run_dir in (self.base_dir, self.head_dir):
            store.update_manifest(run_dir, pass_wall_s=dict(self.walls))

    def stopped(self) -> None:
        from harness import store

        for run_dir in (self.base_dir, self.head_dir):
            store.update_manifest(run_dir, status="interrupted")


def _tree_env(env: dict, tree: dict | None) -> dict:
    """A run's env fingerprint with the git state of the commit it measures, when that commit
    is of the harness's own repository (its `git_sha` names the code measured)."""
    from harness.execute.executors.process import PROJECT_ROOT

    if tree is None or Path(tree["repo"]).resolve() != PROJECT_ROOT.resolve():
        return dict(env)
    return {**env, "git_sha": tree["sha"][:12], "git_dirty": False}
