"""The profiler passes side by side (harness.execute.profiler_passes.profile_passes with several
GPUs), with the real ncu and nsys, on a one-GPU machine: re-runs a finished run's ncu and nsys
passes as if the host had GPUs 0 and 1, every profiler process pinned to GPU 0, so the joint
scheduler deals the passes onto two lanes that are the same card. What it checks is the plumbing
(the lanes' processes, out dirs, exports, the merge and the manifest), not a speed-up: the two
lanes share one GPU.

    python3 tools/device/side_by_side_check.py RUN_DIR     (device, after a complete GPU run)

Prints the passes' states, walls and shards and the metric rows per source before and after.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from harness import store

from harness.execute import profiler_passes
from harness.execute.executors.gpus import GpuExecutor
from harness.execute.runner import Runner, wall_line


def main(run_dir: str) -> int:
    run = Path(run_dir)
    before = store.load_metrics(run).groupby("source").size().to_dict()
    passes = dict(store.load_manifest(run)["passes"])
    passes.update({p: "pending" for p in ("ncu", "nsys")})
    store.update_manifest(run, passes=passes)
    console = Console()
    pinned = profiler_passes.worker_env
    profiler_passes.worker_env = lambda device, gpu=None: pinned(device, 0)  # "GPU 1" is GPU 0
    r = Runner(run, console, GpuExecutor([0, 1]))
    r.pass_wall = {}
    with Progress(console=console, transient=True) as progress:
        r._profilers(progress)
    m = store.load_manifest(run)
    after = store.load_metrics(run).groupby("source").size().to_dict()
    print("passes:", {p: m["passes"].get(p) for p in ("ncu", "nsys")})
    print(wall_line({**r.pass_wall, "total": sum(v for k, v in r.pass_wall.items()
                                                if "+" in k)}))
    for p in ("ncu", "nsys"):
        w = (m.get("profiler_wall_s") or {}).get(p, {})
        print(p, json.dumps({k: v for k, v in w.items() if k != "per_case_s"}))
    print("metric rows per source, before:", before, "after:", after)
    ok = all(str(m["passes"].get(p, "")).startswith("done") for p in ("ncu", "nsys"))
    return 0 if ok and before == after else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
