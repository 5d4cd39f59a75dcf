"""`run --profile-harness`: where the harness's own time goes, process by process.

The driver and every worker process it starts (check, time, compile-ahead, profiler passes)
run under cProfile; each writes `raw/harness_profile/<process>.pstats` (for `python -m pstats`
or snakeviz) and `<process>.txt`, the TOP functions by cumulative time. Workers learn the
folder from HARNESS_PROFILE_DIR, which they inherit. cProfile follows the thread it was started
on: time spent in a thread pool (the Tuners' concurrent precompile) shows as the main thread
waiting on it. Nothing it writes is a measurement of a kernel; the run's numbers are those of a
run whose Python is some 10-30 % slower, so profile a run, do not compare it.
"""
from __future__ import annotations

import cProfile
import os
import pstats
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ENV = "HARNESS_PROFILE_DIR"
FOLDER = "harness_profile"
TOP = 60


def enable_for(run_dir: Path) -> Path:
    """Profile this process and the workers it starts from now on; returns the folder."""
    d = Path(run_dir, "raw", FOLDER)
    d.mkdir(parents=True, exist_ok=True)
    os.environ[ENV] = str(d)
    return d


def _write(pr: cProfile.Profile, folder: Path, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    pr.dump_stats(str(folder / f"{name}.pstats"))
    with open(folder / f"{name}.txt", "w") as f:
        pstats.Stats(pr, stream=f).sort_stats("cumulative").print_stats(TOP)


@contextmanager
def profiled(name: str) -> Iterator[None]:
    """Run the block under cProfile when HARNESS_PROFILE_DIR is set (else do nothing)."""
    folder = os.environ.get(ENV)
    if not folder:
        yield
        return
    pr = cProfile.Profile()
    pr.enable()
    try:
        yield
    finally:
        pr.disable()
        _write(pr, Path(folder), f"{name}-{os.getpid()}")
