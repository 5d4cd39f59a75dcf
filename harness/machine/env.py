"""Environment fingerprint, gathered without initialising CUDA (nvidia-smi, package metadata, git).

Two runs are comparable when gpu_name, driver and clock limits match (see analysis.compare).
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
from pathlib import Path

# how samples are taken, in every run's env fingerprint: runs timed by different methods are not
# compared (analysis.compare.env_problems), and a calibration made by another is redone
# (harness.execute.timing's method; here, below timing, so the fingerprint needs no timing)
TIMING_METHOD = "l2-read-flush"

NVSMI_FIELDS = [
    ("gpu_name", "name"),
    ("driver", "driver_version"),
    ("gpu_memory_mib", "memory.total"),
    ("sm_clock_mhz", "clocks.sm"),
    ("mem_clock_mhz", "clocks.mem"),
    ("sm_clock_max_mhz", "clocks.max.sm"),
    ("mem_clock_max_mhz", "clocks.max.mem"),
    ("app_sm_clock_mhz", "clocks.applications.graphics"),
    ("power_limit_w", "power.limit"),
    ("gpu_temp_c", "temperature.gpu"),
    ("pstate", "pstate"),
]


def _version(pkg: str) -> str | None:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def query_gpus(timeout: float = 10.0, index: int | None = None) -> list[dict]:
    """One dict per GPU from nvidia-smi (only GPU `index` if given); [] without an NVIDIA
    driver. nvidia-smi numbers GPUs like CUDA_VISIBLE_DEVICES does (PCI bus order)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    argv = [exe, "--query-gpu=" + ",".join(q for _, q in NVSMI_FIELDS),
            "--format=csv,noheader,nounits"] + (["-i", str(index)] if index is not None else [])
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    gpus = []
    for line in out.stdout.strip().splitlines():
        vals = [v.strip() for v in line.split(",")]
        if len(vals) != len(NVSMI_FIELDS):
            continue
        row = {}
        for (key, _), v in zip(NVSMI_FIELDS, vals):
            if v in ("[N/A]", "N/A", "[Not Supported]", ""):
                row[key] = None
                continue
            try:
                row[key] = float(v) if key not in ("gpu_name", "driver", "pstate") else v
            except ValueError:
                row[key] = v
        gpus.append(row)
    return gpus


def gpu_state(index: int) -> dict:
    """{gpu_name, sm_clock_mhz, mem_clock_mhz, gpu_temp_c} of GPU `index` now, as a worker
    records it per case: NVML in-process (microseconds), nvidia-smi where NVML cannot be
    loaded; {} where neither answers."""
    from harness.machine import nvml

    state = nvml.gpu_state(index)
    if state is None:
        rows = query_gpus(index=index)
        state = {k: rows[0].get(k) for k in ("gpu_name", "sm_clock_mhz", "mem_clock_mhz",
                                             "gpu_temp_c")} if rows else {}
    return state


def git_info(cwd: str | Path | None = None) -> dict:
    def git(*args):
        try:
            r = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                               cwd=cwd)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    if os.environ.get("HARNESS_GIT_SHA"):
        # a copy of the checkout shipped elsewhere (a remote GPU box): the sender says which
        # commit it is; it wins over a .git there, which may be stale or someone else's
        return {"git_sha": os.environ["HARNESS_GIT_SHA"][:12],
                "git_dirty": os.environ.get("HARNESS_GIT_DIRTY", "") == "1"}
    sha = git("rev-parse", "--short=12", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"git_sha": sha, "git_dirty": bool(dirty) if dirty is not None else None}


def fingerprint(device: str) -> dict:
    """Everything that decides whether two runs' numbers may be compared."""
    import torch  # cheap: importing torch does not create a CUDA context

    gpus = query_gpus() if device == "cuda" else []
    gpu = gpus[0] if gpus else {}
    env = {
        "device": device,
        "gpu_name": gpu.get("gpu_name") if device == "cuda" else None,
        "gpu_count": len(gpus),
        "driver": gpu.get("driver"),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        **{k: gpu.get(k) for k, _ in NVSMI_FIELDS if k not in ("gpu_name", "driver")},
    }
    env["timing_method"] = TIMING_METHOD if device == "cuda" else None
    env.update(git_info(Path(__file__).resolve().parents[2]))
    return env


def cuda_device_present() -> tuple[bool, str]:
    """(present, reason) without touching CUDA in this process."""
    import torch

    if torch.version.cuda is None:
        return False, f"torch {torch.__version__} is a CPU-only build"
    if not query_gpus():
        return False, "nvidia-smi found no NVIDIA GPU"
    return True, ""
