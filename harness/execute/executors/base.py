"""The executor interface (harness.execute.executors.choose builds one from the CLI flags or a
stored manifest)."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Callable


class Executor:
    """Runs the check + time passes of `case_ids` (longest first) with per-case limits."""

    kind = "local"
    # called with a GPU's number once its shard of the measure passes has ended (--gpus: the
    # runner lets that GPU's profiler processes start profiling: profiler_early.Early.gate)
    on_shard_done: Callable[[int | None], None] | None = None

    def describe(self) -> dict:
        """The manifest's `executor` record: kind, GPUs used, hosts."""
        return {"kind": self.kind, "gpus": [], "hosts": [socket.gethostname()]}

    def measure(self, run_dir: Path, case_ids: list[str], cost: dict[str, float],
                limits: dict[str, float], device: str,
                on_event: Callable[[dict], None]) -> None:
        raise NotImplementedError

    def profiler_gpu(self) -> int | None:
        """The first GPU the profiler passes run on (None: whatever the process sees)."""
        return None

    def profiler_gpus(self) -> list[int | None]:
        """The GPUs the profiler passes shard their cases over (one profiler process each)."""
        return [self.profiler_gpu()]
