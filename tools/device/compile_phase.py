"""The compile phase of a run alone: compile-ahead and the checks beside it (device).

    python3 tools/device/compile_phase.py EXP STORE [run arguments, e.g. --gpus all]

Starts `python -m harness run EXP --store STORE ...` as usual and stops it once the compile
phase is over (the check, time and profiler passes do not run; the run is left unfinished in
STORE). Prints one JSON line: the phase's wall seconds, its workers, and per worker the seconds
of its cases (parts warm.warm<i>) and, in its order, the implementations of its cases that took
over 0.5 s (a class's first case: the one that compiled). On a CPU there is no compile phase
(compile_s null). A deal of compile-ahead's classes (schedule.warm_shards) is measured by a few
such phases against another commit's, each with fresh TRITON_CACHE_DIR and
TORCHINDUCTOR_CACHE_DIR, alternating (the whole run varies by 5-10 s between hosts and runs, the
phase itself by less). Which harness runs is PYTHONPATH's: point it at the other commit's tree.
"""
import json
import sys
from pathlib import Path


class _Stop(Exception):
    pass


def main(argv: list[str]) -> int:
    import os

    from harness.execute import pycache

    pycache.apply_here()
    # the phase alone: the check pass would start beside it (harness.execute.compile_phase)
    os.environ["HARNESS_CHECK_DURING_COMPILE"] = "0"
    from harness.cli import main as harness_main
    from harness.execute.compile_phase import CompilePhase

    seen: dict = {}
    original = CompilePhase.join

    def compile_only(self):  # the phase's end (recorded), then the run stops
        original(self)
        r = self.runner
        seen.update(run_dir=r.run_dir, wall_s=r.pass_wall.get("compile"))
        raise _Stop()

    CompilePhase.join = compile_only
    exp, out = argv[0], argv[1]
    try:
        harness_main(["run", exp, "--store", out, *argv[2:]])
    except _Stop:
        pass
    if "run_dir" not in seen:
        print(json.dumps({"error": "the run ended before its compile phase"}))
        return 1
    run_dir = Path(seen["run_dir"])
    workers = []
    for f in sorted(Path(run_dir, "parts").glob("warm.warm*.jsonl"),
                    key=lambda f: int(f.name.split(".")[1][4:])):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        impls = [r["case_id"].split(".")[0] for r in rows if (r.get("wall_s") or 0) > 0.5]
        workers.append({"worker": f.name.split(".")[1], "cases": len(rows),
                        "case_s": round(sum(r.get("wall_s") or 0.0 for r in rows), 2),
                        "slow_cases": impls})
    print(json.dumps({"run": run_dir.name, "compile_s": seen["wall_s"],
                      "workers": len(workers),
                      "longest_worker_s": max((w["case_s"] for w in workers), default=None),
                      "per_worker": workers}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
