"""The check pass's first worker, started while compile-ahead runs.

A cold GPU run compiles ahead (harness.execute.executors.warm) before its check pass, on the
CPU's cores; the check pass's first worker then started and paid its own set-up (Python,
torch, Triton and Inductor imported, CUDA's context) on the critical path of every GPU.
`EarlyCheck` starts that worker with compile-ahead instead: `--wait-for` a turn file, so it
sets up what launches no kernel (harness.execute.touch: CUDA's context once the GPU has room)
and waits. When compile-ahead is over, run_shard gives it the cases left to check and time
(`go`), in place of starting its first worker, and the Driver does whatever it left (a fault
it met is recorded as the Driver records one). Nothing it does before its turn touches a case.
"""
from __future__ import annotations

from pathlib import Path

from harness.execute import sharing
from harness.execute.executors.process import (MEASURE_PASSES, TurnWorker, worker_argv,
                                               worker_env)


class EarlyCheck(TurnWorker):
    """One `--passes check,time --wait-for` worker for a shard (`shard`, on `gpu`), writing to
    the shard's measure log; its Driver comes with its turn (`go(case_ids, drive)`)."""

    def __init__(self, run_dir: Path, *, device: str, limits: dict[str, float],
                 gpu: int | None, shard: str | None, log_path: Path):
        from harness.tuning import gpu_lock

        env = {**worker_env(device, gpu), gpu_lock.ENV: sharing.lock_path(run_dir, gpu)}
        go_file = sharing.turn_file(run_dir, f"check.{shard}" if shard else "check")
        argv = (worker_argv(run_dir, ",".join(MEASURE_PASSES), device, shard=shard)
                + ["--wait-for", str(go_file)])
        super().__init__(argv, env, log_path, limits, gpu, go_file,
                         f"early-check-{shard or 'local'}")
