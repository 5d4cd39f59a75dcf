"""The Profiler interface: launch and parse are separate, so parsing is tested on real fixtures.

A profiler wraps the worker's `profile` pass (warm-up outside, one call per case inside an NVTX
range of domain `harness` named for the case id):

    argv = prof.command(worker_argv, out_dir, options)   # run by the runner, logged, timed out
    prof.export(out_dir)                                  # tool's own files -> CSV in out_dir
    df   = prof.parse(out_dir)                            # long format, canonical metric names

`parse` returns columns case_id, source, kernel, name, value, unit (see harness.store).
"""
from __future__ import annotations

import shlex
import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import pandas as pd


METRIC_COLUMNS = ["case_id", "source", "kernel", "name", "value", "unit"]


@dataclass(frozen=True)
class Availability:
    ok: bool
    detail: str  # the executable path and version when ok, else why not (and where we looked)


class ProfilerFailed(RuntimeError):
    """The profiler ran but its output could not be produced or read; raw logs are kept."""


class Profiler(ABC):
    name: str = ""
    source: str = ""

    @abstractmethod
    def availability(self) -> Availability: ...

    def is_available(self) -> bool:
        return self.availability().ok

    @abstractmethod
    def command(self, worker_argv: list[str], out_dir: Path, options) -> list[str]: ...

    def env(self) -> dict[str, str]:
        """Extra environment for the profiled process."""
        return {}

    def export(self, out_dir: Path) -> None:
        """Turn the tool's own output into the CSV files `parse` reads (default: nothing)."""

    @abstractmethod
    def parse(self, out_dir: Path) -> pd.DataFrame: ...

    def prepare(self, options, cases: pd.DataFrame, case_ids: list[str]):
        """Options with run-dependent choices ("auto") settled for these cases (default: as is)."""
        return options

    # the store tables besides metrics that extra_tables may write (a case_id column each):
    # the pass writes them whole, and a profile carried over brings its rows of them
    tables: tuple[str, ...] = ()

    def extra_tables(self, out_dir: Path) -> dict[str, pd.DataFrame]:
        """Store tables besides metrics that this pass produced, by table name (default: none)."""
        return {}


def run_logged(argv: list[str], log_path: Path, timeout: float | None = None,
               stdout_path: Path | None = None) -> subprocess.CompletedProcess:
    """Run argv (never a shell string); keep the command line and output under raw/."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"$ {shlex.join(argv)}\n")
        log.flush()
        out = open(stdout_path, "w") if stdout_path else log
        try:
            proc = subprocess.run(argv, stdout=out, stderr=log, text=True, timeout=timeout)
        finally:
            if stdout_path:
                out.close()
        log.write(f"[exit {proc.returncode}]\n")
    return proc


def empty_metrics() -> pd.DataFrame:
    return pd.DataFrame(columns=METRIC_COLUMNS)


_REGISTRY: dict[str, type[Profiler]] = {}


def register(cls: type[Profiler]) -> type[Profiler]:
    _REGISTRY[cls.name] = cls
    return cls
