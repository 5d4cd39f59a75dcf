"""Fallback kernel table when nsys is absent: torch.profiler (Kineto/CUPTI) around the one call.

It gives the same per-case facts as the nsys pass (kernels launched, their count and GPU time),
labelled source=torch_profiler. No wrapping tool: the worker profiles in-process and the runner
writes the records to raw/torch_profiler/kernels.json, which `parse` reads.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from harness.profilers.base import Availability, Profiler, empty_metrics, register

KERNELS_FILE = "kernels.json"


def write_kernels(run_dir: Path, out_dir: Path, ids: list[str]) -> None:
    """raw/torch_profiler/kernels.json: the kernels each case of `ids` launched, from the
    worker's records (parts/torch_profiler), for `parse`."""
    from harness import store

    keep = set(ids)
    store.write_json(Path(out_dir) / KERNELS_FILE, {
        r["case_id"]: r.get("kernels", []) for r in store.read_parts(run_dir, "torch_profiler")
        if r["status"] == "ok" and r["case_id"] in keep})


def profile_call(fn, device: str) -> list[dict]:
    """Run fn once under torch.profiler; one dict per GPU activity (kernel, memcpy, memset)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    out = []
    for e in prof.events():
        if device == "cuda" and e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        out.append({"name": e.name, "time_us": float(e.time_range.elapsed_us())})
    return out


@register
class TorchProfiler(Profiler):
    name = "torch_profiler"
    source = "torch_profiler"

    def availability(self) -> Availability:
        try:
            import torch.profiler  # noqa: F401
        except ImportError as exc:  # pragma: no cover - torch always has it
            return Availability(False, f"torch.profiler not importable: {exc}")
        return Availability(True, "torch.profiler (in-process, CUPTI)")

    def command(self, worker_argv: list[str], out_dir: Path, options) -> list[str]:
        return list(worker_argv)

    def parse(self, out_dir: Path) -> pd.DataFrame:
        path = Path(out_dir) / KERNELS_FILE
        if not path.exists():
            return empty_metrics()
        return kernels_to_metrics(json.loads(path.read_text()))


def kernels_to_metrics(per_case: dict[str, list[dict]]) -> pd.DataFrame:
    rows = []
    for case, kernels in per_case.items():
        agg: dict[str, list[float]] = {}
        for k in kernels:
            agg.setdefault(k["name"], []).append(float(k["time_us"]))
        for name, times in agg.items():
            rows.append((case, "torch_profiler", name, "kernel_launches", float(len(times)),
                         "count"))
            rows.append((case, "torch_profiler", name, "kernel_time_us", sum(times), "us"))
        rows.append((case, "torch_profiler", "", "kernel_count",
                     float(sum(len(t) for t in agg.values())), "count"))
        rows.append((case, "torch_profiler", "", "gpu_time_us",
                     sum(sum(t) for t in agg.values()), "us"))
        rows.append((case, "torch_profiler", "", "distinct_kernels", float(len(agg)), "count"))
    if not rows:
        return empty_metrics()
    return pd.DataFrame(rows, columns=["case_id", "source", "kernel", "name", "value", "unit"])
