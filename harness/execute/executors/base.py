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
    # per GPU, the cases its measure passes got (--gpus: set by `measure`; None: one shard)
    planned: dict | None = None

    def early_shards(self) -> list[tuple[int | None, str | None, str]]:
        """(GPU, shard, measure log name) of each worker the measure passes start first: what
        `start_early` starts ahead (none: this executor starts none ahead)."""
        return []

    def start_early(self, run_dir: Path, device: str, limits: dict[str, float]) -> None:
        """Start each shard's first check worker now, to wait for its turn (early_check): the
        runner calls this as compile-ahead starts; `measure` gives them their cases."""
        from harness import store
        from harness.execute.executors.early_check import EarlyCheck

        self.cancel_early()
        logs = store.raw_dir(Path(run_dir), "logs")
        for gpu, shard, log in self.early_shards():  # each kept as it starts: cancel_early
            self._early[gpu] = EarlyCheck(run_dir, device=device, limits=limits, gpu=gpu,
                                          shard=shard, log_path=logs / log)

    def take_early(self, gpu: int | None):
        """The waiting first worker of `gpu`'s shard (None: none was started), now the
        caller's."""
        return getattr(self, "_early", {}).pop(gpu, None)

    def cancel_early(self) -> None:
        """End the first workers no shard took (nothing left to measure, or the run stopped)."""
        from harness.execute.executors.process import cancel_all

        early, self._early = getattr(self, "_early", {}), {}
        cancel_all(early.values())

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
