"""Choosing the executor: from the CLI flags (`--gpus`, `--ray`) or a stored run's manifest.
The executors themselves import only base: this module is the one place that knows them all."""
from __future__ import annotations

from harness.errors import HarnessError
from harness.execute.executors.base import Executor


def make_executor(gpus: str | None = None, ray: str | None = None, device: str = "cuda",
                  present: list[dict] | None = None) -> Executor:
    """`--gpus` / `--ray` (at most one) -> an executor. `present`: GPUs as nvidia-smi lists
    them (queried here when not given; never through CUDA)."""
    if gpus and ray:
        raise HarnessError("run: give --gpus or --ray, not both (a Ray task gets one GPU each)")
    if ray:
        from harness.execute.executors.ray_exec import RayExecutor

        return RayExecutor(ray)
    if gpus:
        from harness.execute.executors.gpus import GpuExecutor
        from harness.execute.executors.schedule import parse_gpus

        if device == "cpu":
            raise HarnessError(f"--gpus {gpus}: the run is on the CPU (--device cpu or no GPU); "
                               "drop one of them")
        if present is None:
            from harness.machine.env import query_gpus

            present = query_gpus()
        idx = parse_gpus(gpus, present)
        return GpuExecutor(idx, {i: present[i] for i in idx})
    from harness.execute.executors.local import LocalExecutor

    return LocalExecutor()


def from_manifest(m: dict) -> Executor:
    """The executor a resumed run continues with (the one it started with)."""
    ex = m.get("executor") or {}
    if ex.get("kind") == "gpus":
        return make_executor(gpus=",".join(str(g) for g in ex.get("gpus", [])),
                             device=m.get("device", "cuda"))
    if ex.get("kind") == "ray":
        return make_executor(ray=ex.get("address") or "local")
    return make_executor()
