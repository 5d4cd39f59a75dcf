"""Tiny synthetic runs written with the store's own functions (labelled `synthetic`), for the
noise-floor, pairing and since-block tests. Samples are drawn around a given median."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from harness import store

GPU_ENV = {"device": "cuda", "gpu_name": "NVIDIA H200", "driver": "580.159.04",
           "sm_clock_max_mhz": 1980.0, "mem_clock_max_mhz": 3201.0, "app_sm_clock_mhz": 1980.0,
           "torch": "2.11.0+cu130", "triton": "3.6.0", "hostname": "gpu-box", "cpu": "x86_64",
           "git_sha": "c896ab45378f", "git_dirty": False}
CPU_ENV = {**GPU_ENV, "device": "cpu", "gpu_name": None, "driver": None,
           "sm_clock_max_mhz": None, "mem_clock_max_mhz": None, "app_sm_clock_mhz": None,
           "torch": "2.13.0+cpu", "triton": "3.9.0", "hostname": "vm"}
T0 = datetime(2026, 11, 22, 2, 0, tzinfo=timezone.utc)


def samples(median: float, n: int = 200, rel_sd: float = 0.004, seed: int = 1) -> np.ndarray:
    return median * (1 + np.random.default_rng(seed).normal(0, rel_sd, n))


def case_id(impl: str, n: int, dtype: str = "float16") -> str:
    return f"{impl}.M=64.N={n}.{dtype}"


def write_run(root: Path, *, minutes: int, medians: dict[str, float], name: str = "synthetic",
              op: str = "softmax", env: dict | None = None, spec_hash: str = "spec-a",
              status: str = "complete", seed: int = 0, rel_sd: float = 0.004, n: int = 200,
              extra: dict[str, dict] | None = None, metrics: list[dict] | None = None,
              timed: bool = True, against: dict | None = None, processes: int = 0,
              proc_sd: float | dict[str, float] = 0.0) -> Path:
    """A run `minutes` after T0 whose case `<impl>.M=64.N=<N>.float16` (keys of `medians`, as
    "impl/N") has samples around the given median; `extra` adds results columns per case id
    (config, compiled, code_hash). With `processes`, the time pass's worker processes: each
    draws its own offset (relative sd `proc_sd`, per "impl/N" key when a dict) and n/processes
    samples around it, and the results carry process_medians_ms."""
    env = dict(GPU_ENV if env is None else env)
    created = T0 + timedelta(minutes=minutes)
    run_id = store.new_run_id(name, created)
    run_dir = root / run_id
    (run_dir / "raw").mkdir(parents=True)
    store.write_manifest(run_dir, {
        "run_id": run_id, "schema_version": store.SCHEMA_VERSION, "device": env["device"],
        "env": env, "status": status, "spec_hash": spec_hash,
        "created_utc": created.isoformat(), "command": ["python", "-m", "harness", "run", "x"],
        "experiment": {"name": name, "op": op, "baseline": "torch", "candidates": ["triton"]},
        **({"against": against} if against is not None else {})})
    crows, rrows, srows = [], [], []
    for i, (key, med) in enumerate(medians.items()):
        impl, nn = key.split("/")
        cid = case_id(impl, int(nn))
        crows.append({"case_id": cid, "op": op, "impl": impl,
                      "role": "baseline" if impl == "torch" else "candidate",
                      "params": json.dumps({"M": 64, "N": int(nn)}), "dtype": "float16",
                      "status": "ok", "error": None})
        procs, proc_meds = np.zeros(n, dtype=int), None
        if timed and processes:
            sd = proc_sd.get(key, 0.0) if isinstance(proc_sd, dict) else proc_sd
            rng = np.random.default_rng(seed * 1000 + i + 500)
            parts = [samples(med * (1 + rng.normal(0, sd)), n // processes, rel_sd,
                             seed * 1000 + i + 100 * k) for k in range(processes)]
            x = np.concatenate(parts)
            procs = np.repeat(np.arange(processes), n // processes)
            proc_meds = json.dumps([float(np.median(p)) for p in parts])
        else:
            x = samples(med, n, rel_sd, seed * 1000 + i) if timed else np.array([])
        rrows.append({"case_id": cid, "correct": True,
                      "median_ms": float(np.median(x)) if len(x) else None,
                      "process_medians_ms": proc_meds, **(extra or {}).get(cid, {})})
        srows += [{"case_id": cid, "i": j, "ms": float(v), "process": int(procs[j])}
                  for j, v in enumerate(x)]
    store.write_table(run_dir, "cases", pd.DataFrame(crows))
    store.write_table(run_dir, "results", pd.DataFrame(rrows))
    store.write_table(run_dir, "samples", pd.DataFrame(srows, columns=store.SAMPLE_COLUMNS))
    if metrics:
        store.write_table(run_dir, "metrics", pd.DataFrame(metrics))
    return run_dir


def ncu_rows(cid: str, **values) -> list[dict]:
    rows = []
    for name, v in values.items():
        text = isinstance(v, str)
        rows.append({"case_id": cid, "source": "ncu", "kernel": "k", "name": name,
                     "value": 1.0 if text else float(v), "unit": v if text else ""})
    return rows
