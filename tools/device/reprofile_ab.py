"""The profiler passes of one finished run, again and again, alternating two checkouts
(device): what a change to the profiler passes' scheduling costs or saves, on one machine.

    python3 tools/device/reprofile_ab.py RUN_DIR ROOT_A ROOT_B [ROUNDS]

Each round marks RUN_DIR's ncu and nsys passes undone (status interrupted, `reprofile` on, so
nothing is carried over), then finishes it with `harness run --resume` from ROOT_A, then again
from ROOT_B (the driver and its workers both from that checkout). Prints one line per resume:
the checkout, ncu and nsys pass walls, and the command's wall.
"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def reset(run: Path) -> None:
    m = json.loads((run / "manifest.json").read_text())
    m["status"] = "interrupted"
    m["reprofile"] = True
    m["passes"] = {k: v for k, v in m.get("passes", {}).items() if k not in ("ncu", "nsys")}
    (run / "manifest.json").write_text(json.dumps(m, indent=1))
    for name in ("ncu", "nsys"):
        shutil.rmtree(run / "raw" / name, ignore_errors=True)
        for part in (run / "parts").glob(f"{name}*.jsonl"):
            part.unlink()


def main() -> None:
    run, a, b = Path(sys.argv[1]).resolve(), sys.argv[2], sys.argv[3]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    for r in range(rounds):
        for label, root in (("A", a), ("B", b)):
            reset(run)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(Path(root).resolve()), *os.environ.get("PYTHONPATH", "").split(os.pathsep)])}
            t0 = time.monotonic()
            p = subprocess.run([sys.executable, "-m", "harness", "run", "--resume", str(run),
                                "--store", str(run.parent)], cwd=root, env=env,
                               capture_output=True, text=True)
            wall = time.monotonic() - t0
            m = json.loads((run / "manifest.json").read_text())
            w = m.get("pass_wall_s", {})
            print(f"round {r} {label} rc={p.returncode} ncu {w.get('ncu')} nsys {w.get('nsys')} "
                  f"passes {m.get('passes')} command {wall:.1f} s", flush=True)
            if p.returncode:
                print(p.stdout[-2000:], p.stderr[-2000:])


if __name__ == "__main__":
    main()
