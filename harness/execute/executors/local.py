"""One worker process at a time on this host (the default executor)."""
from __future__ import annotations

from pathlib import Path

from harness import store
from harness.execute.executors.base import Executor
from harness.execute.executors.process import run_shard


class LocalExecutor(Executor):
    kind = "local"

    def early_shards(self) -> list[tuple[int | None, str | None, str]]:
        return [(None, None, "measure.log")]

    def measure(self, run_dir, case_ids, cost, limits, device, on_event) -> None:
        log = store.raw_dir(Path(run_dir), "logs") / "measure.log"
        run_shard(Path(run_dir), case_ids, device=device, limits=limits, log_path=log,
                  on_event=on_event, early=self.take_early(None))
