"""One worker process per GPU of this host, each pinned with CUDA_VISIBLE_DEVICES.

The cases are sharded longest-first onto the GPUs (`schedule.shard`: whole shapes, or whole
families of shapes where that pays, `families`); each GPU checks and times only its own shard,
one case at a time, so no two timings ever share a GPU. Each worker appends to its own
parts/<pass>.gpu<i>.jsonl. Ctrl-C stops every worker; a dead or hung worker costs its
case in flight and its GPU carries on with the rest of its shard (`process.run_shard`). The
profiler passes share the GPUs too (harness.execute.profiler_passes): their implementation units
are dealt onto the GPUs together, each GPU running its ncu / nsys processes in turn, each
writing its own report (raw/<profiler>/gpu<i>/ where a pass spans several GPUs), parsed and
merged into the run's tables.
"""
from __future__ import annotations

import socket
import threading
from pathlib import Path

from harness import store
from harness.execute.executors.base import Executor
from harness.execute.executors.process import (Interrupted, cancel_all, run_shard,
                                               run_threads)
from harness.execute.executors.schedule import non_size_values, shard


class GpuExecutor(Executor):
    kind = "gpus"

    def __init__(self, gpus: list[int], fingerprints: dict[int, dict] | None = None):
        self.gpus = list(gpus)
        self.fingerprints = fingerprints or {}

    def describe(self) -> dict:
        return {"kind": self.kind, "gpus": self.gpus, "hosts": [socket.gethostname()],
                "gpu_fingerprints": {str(g): self.fingerprints.get(g, {}) for g in self.gpus}}

    def profiler_gpu(self) -> int | None:
        return self.gpus[0]

    def profiler_gpus(self) -> list[int | None]:
        return list(self.gpus)

    def plan(self, case_ids: list[str], cost: dict[str, float],
             shape_of: dict[str, str] | None = None,
             family_of: dict[str, str] | None = None) -> dict[int, list[str]]:
        return dict(zip(self.gpus, shard(case_ids, cost, len(self.gpus), shape_of, family_of)))

    def early_shards(self) -> list[tuple[int | None, str | None, str]]:
        return [(g, f"gpu{g}", f"measure.gpu{g}.log") for g in self.gpus]

    def measure(self, run_dir, case_ids, cost, limits, device, on_event) -> None:
        run_dir = Path(run_dir)
        stop = threading.Event()
        errors: list[BaseException] = []
        lock = threading.Lock()

        def locked(ev):
            with lock:
                on_event(ev)

        def one(gpu: int, ids: list[str]):
            try:
                run_shard(run_dir, ids, device=device, limits=limits, gpu=gpu,
                          shard=f"gpu{gpu}", on_event=locked, stop=stop,
                          log_path=store.raw_dir(run_dir, "logs") / f"measure.gpu{gpu}.log",
                          early=self.take_early(gpu))
                if self.on_shard_done is not None:
                    self.on_shard_done(gpu)
            except Interrupted:
                pass
            except BaseException as exc:  # re-raised in the main thread
                errors.append(exc)
                stop.set()

        plan = self.planned = self.plan(case_ids, cost, store.shapes(run_dir),
                                        families(run_dir))
        # a GPU with nothing to do: its first worker ends now (run_shard ends the others)
        cancel_all(e for g, ids in plan.items() if not ids and (e := self.take_early(g)))
        run_threads([threading.Thread(target=one, args=(g, ids), name=f"gpu{g}", daemon=True)
                     for g, ids in plan.items() if ids], stop)
        if errors:
            raise errors[0]


def families(run_dir: Path) -> dict[str, str]:
    """case_id -> its family (schedule.shard): the values of its params that are not sizes (the
    op's Param.size) and its dtype, the cases whose implementations run the same compiled
    kernels; {} where the run's op cannot be loaded."""
    from harness.execute.code_tree import op_for

    try:
        size = {p.name for p in op_for(store.load_manifest(run_dir)).params if p.size}
    except Exception:  # a deal of shapes, as before
        return {}
    return {r.case_id: repr((non_size_values(r.params, size), r.dtype))
            for r in store.load_cases(run_dir).itertuples()}
