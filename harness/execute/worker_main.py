"""`python -m harness worker ...`: the worker process's command line. It runs the passes of a
harness.execute.worker.Worker, or the `ab` pass of a harness.execute.ab_worker.AbWorker (which
builds on the Worker: this module, not worker.py, knows both)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness.execute.worker import PASSES, Worker


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="harness worker")
    ap.add_argument("--run", required=True)
    ap.add_argument("--passes", required=True)
    ap.add_argument("--cases", default=None, help="comma-separated case ids")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tag", default=None, help="record as parts/<tag>.jsonl (one pass only)")
    ap.add_argument("--shard", default=None, help="record as parts/<pass>.<shard>.jsonl")
    ap.add_argument("--ahead", action="store_true",
                    help="check beside other work: a case that raised or timed a Tuner is "
                         "left unrecorded for the check pass")
    ap.add_argument("--prewarm", action="store_true",
                    help="one untimed call of each case before the passes")
    ap.add_argument("--load-after", default=None,
                    help="with --prewarm: wait for this file to exist before the untimed calls "
                         "(a profiler process started while the time pass runs)")
    ap.add_argument("--claims", default=None,
                    help="a folder with units.json ({case: class}): do a case only if its "
                         "class is claimed for this worker (compile-ahead's work stealing)")
    ap.add_argument("--wait-for", default=None,
                    help="before the passes, wait for this file: its JSON list of case ids "
                         "replaces --cases")
    a = ap.parse_args(argv)
    passes = [p for p in a.passes.split(",") if p]
    if a.tag and len(passes) != 1:
        print("worker: --tag needs exactly one pass", file=sys.stderr)
        return 2
    for p in passes:
        if p not in PASSES:
            print(f"worker: unknown pass {p!r} (valid: {', '.join(PASSES)})", file=sys.stderr)
            return 2
    if a.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    only = list(dict.fromkeys(a.cases.split(","))) if a.cases else None
    from harness.execute import selfprofile
    from harness.tuning import inductor_picks

    if a.device == "cuda":  # Inductor's config choices made once per host, not per process
        inductor_picks.install()
    try:
        return _run(a, passes, only, selfprofile)
    finally:
        line = inductor_picks.summary()
        if line:
            print(f"worker: {line}", file=sys.stderr, flush=True)


def _run(a, passes: list[str], only: list[str] | None, selfprofile) -> int:
    if passes == ["ab"]:
        from harness.execute.ab_worker import AbWorker

        with selfprofile.profiled("worker-ab"):
            return AbWorker(Path(a.run), a.device).run(only)
    if "ab" in passes:
        print("worker: the ab pass runs alone (--passes ab)", file=sys.stderr)
        return 2

    w = Worker(Path(a.run), a.device)
    with selfprofile.profiled("worker-" + "-".join([*passes, *(x for x in (a.shard, a.tag) if x)])):
        return w.run(passes, only, a.tag, a.shard, ahead=a.ahead, prewarm=a.prewarm,
                     wait_for=a.wait_for, claims=a.claims, load_after=a.load_after)
