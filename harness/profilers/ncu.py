"""Nsight Compute: one report per run pass, exported to CSV, parsed into canonical metrics.

    ncu --nvtx --nvtx-include regex:harness@.+/ --section ... --metrics ...
        --cache-control all --clock-control none --target-processes all --replay-mode kernel
        -f -o raw/ncu/report  python -m harness worker --passes profile --tag ncu ...
    ncu --import raw/ncu/report.ncu-rep --csv --page raw --print-units base   > raw.csv
    ncu --import raw/ncu/report.ncu-rep --csv --page details --print-units base > details.csv

`--clock-control none` always: never change the card's clocks (shared GPUs); the clocks the
kernels ran at are recorded as sm_clock_hz. The .ncu-rep stays for the Nsight Compute UI.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd

from harness.profilers import metrics as M
from harness.profilers.base import (Availability, Profiler, ProfilerFailed, empty_metrics,
                                    register, run_logged)
from harness.profilers.ncu_parse import parse_raw_csv

NVTX_INCLUDE = "regex:harness@.+/"
REPORT = "report"
PERM_ERROR = "ERR_NVGPUCTRPERM"
PERM_FIX = ("GPU performance counters are restricted to admin users on this machine. Fix: "
            "'options nvidia NVreg_RestrictProfilingToAdminUsers=0' in /etc/modprobe.d/*.conf, "
            "then reload the driver or reboot (https://developer.nvidia.com/ERR_NVGPUCTRPERM); "
            "in containers add --cap-add=SYS_ADMIN")


def find_ncu() -> tuple[str | None, list[str]]:
    looked = ["$HARNESS_NCU", "PATH", "/usr/local/cuda/bin", "/opt/nvidia/nsight-compute/*"]
    cand = os.environ.get("HARNESS_NCU") or shutil.which("ncu")
    if not cand:
        for pattern in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu"):
            hits = sorted(glob.glob(pattern))
            if hits:
                cand = hits[-1]
                break
    return cand, looked


@register
class Ncu(Profiler):
    name = "ncu"
    source = "ncu"

    def availability(self) -> Availability:
        exe, looked = find_ncu()
        if not exe:
            return Availability(False, f"ncu not found (looked in {', '.join(looked)})")
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Availability(False, f"{exe} --version failed: {exc}")
        version = next((l for l in out.stdout.splitlines() if "Version" in l), "").strip()
        return Availability(out.returncode == 0, f"{exe} ({version or 'version unknown'})")

    def command(self, worker_argv: list[str], out_dir: Path, options) -> list[str]:
        exe, _ = find_ncu()
        argv = [exe or "ncu", "--nvtx", "--nvtx-include", NVTX_INCLUDE]
        for s in options.sections:
            argv += ["--section", s]
        extra = sorted(set(M.extra_ncu_metrics()) | set(options.metrics))
        argv += ["--metrics", ",".join(extra), "--disable-extra-suffixes",
                 "--cache-control", "all", "--clock-control", "none",
                 "--target-processes", "all", "--replay-mode", "kernel",
                 "-f", "-o", str(Path(out_dir) / REPORT)]
        return argv + list(worker_argv)

    def export(self, out_dir: Path) -> None:
        out_dir = Path(out_dir)
        rep = out_dir / f"{REPORT}.ncu-rep"
        if not rep.exists():
            raise ProfilerFailed(f"ncu wrote no report ({rep} missing); see {out_dir}/ncu.log")
        exe, _ = find_ncu()
        for page, extra in (("raw", []), ("details", ["--print-details", "all"])):
            argv = [exe or "ncu", "--import", str(rep), "--csv", "--page", page,
                    "--print-units", "base", *extra]
            proc = run_logged(argv, out_dir / "export.log", timeout=600,
                              stdout_path=out_dir / f"{page}.csv")
            if proc.returncode != 0:
                raise ProfilerFailed(f"ncu --import --page {page} exited {proc.returncode}; "
                                     f"see {out_dir}/export.log")

    def parse(self, out_dir: Path) -> pd.DataFrame:
        path = Path(out_dir) / "raw.csv"
        if not path.exists():
            return empty_metrics()
        return parse_raw_csv(path.read_text())


def check_log(text: str) -> str | None:
    """A one-line problem found in ncu's own output, or None."""
    if PERM_ERROR in text:
        return f"{PERM_ERROR}: {PERM_FIX}"
    m = re.search(r"^==ERROR==\s+(.*)$", text, re.M)
    if m:
        return m.group(1).strip()
    if "No kernels were profiled" in text:
        return "ncu profiled no kernels (the NVTX filter matched no range)"
    return None
