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

import csv
import glob
import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd

from harness.profilers import metrics as M
from harness.profilers.base import (Availability, Profiler, ProfilerFailed, empty_metrics,
                                    register, run_logged)

NVTX_INCLUDE = "regex:harness@.+/"
REPORT = "report"
PERM_ERROR = "ERR_NVGPUCTRPERM"
PERM_FIX = ("GPU performance counters are restricted to admin users on this machine. Fix: "
            "'options nvidia NVreg_RestrictProfilingToAdminUsers=0' in /etc/modprobe.d/*.conf, "
            "then reload the driver or reboot (https://developer.nvidia.com/ERR_NVGPUCTRPERM); "
            "in containers add --cap-add=SYS_ADMIN")
NA = {"", "n/a", "N/A", "(!) n/a", "nan"}
_NVTX_ITEM = re.compile(r'"([^"]*?):([^:"]*):[^"]*"')


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


def num(s: str):
    """ncu CSV number: thousands separators stripped; n/a -> None; other text kept as text."""
    t = s.strip()
    if t in NA:
        return None
    try:
        return float(t.replace(",", ""))
    except ValueError:
        return t


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


# ---------------------------------------------------------------------------------------------
# raw page

def read_raw_rows(text: str) -> tuple[list[str], dict[str, str], list[dict[str, str]]]:
    """(header, units by column, rows) of a `--csv --page raw` export or live log.

    Anything before the CSV header (==PROF== lines, the application's stdout) is skipped, and so
    is any later line that does not have the header's number of fields.
    """
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID","Process ID"')), None)
    if start is None:
        raise ValueError("no ncu raw-page CSV header (\"ID\",\"Process ID\",...) found")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = rows[0]
    if len(rows) < 2:
        return header, {}, []
    units = dict(zip(header, rows[1])) if _is_units_row(rows[1]) else {}
    body = rows[2:] if units else rows[1:]
    data = [dict(zip(header, r)) for r in body if len(r) == len(header)]
    return header, units, data


def _is_units_row(row: list[str]) -> bool:
    return bool(row) and row[0] == "" and row[1] == ""


def nvtx_case(cell: str, domain: str = "harness") -> str | None:
    """The innermost push/pop range of `domain` in an ncu NVTX cell, e.g. the case id."""
    items = _NVTX_ITEM.findall(cell or "")
    names = [rng for dom, rng in items if dom == domain]
    return names[-1] if names else None


def _nvtx_column(header: list[str]) -> str | None:
    return next((h for h in header if h.startswith("thread Domain:Push/Pop_Range")), None)


def parse_raw_csv(text: str) -> pd.DataFrame:
    """Long-format canonical metrics, one block of rows per profiled kernel."""
    header, units, data = read_raw_rows(text)
    nvtx_col = _nvtx_column(header)
    rows = []
    seen: dict[tuple[str, str], int] = {}
    for r in data:
        case_id = nvtx_case(r.get(nvtx_col, "")) if nvtx_col else None
        kname = r.get("Kernel Name", "?")
        key = (case_id or "", kname)
        seen[key] = seen.get(key, 0) + 1
        kernel = kname if seen[key] == 1 else f"{kname} #{seen[key]}"
        rows.extend(_kernel_rows(case_id or "", kernel, r, units))
    df = pd.DataFrame(rows, columns=["case_id", "source", "kernel", "name", "value", "unit"])
    return df


def _unit_scale(unit: str, want: str) -> float:
    """Bring a value printed in `unit` to base units (should already be base with --print-units
    base; auto-scaled exports are handled too)."""
    table = {"ns": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9,
             "nsecond": 1.0, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9,
             "hz": 1.0, "Khz": 1e3, "Mhz": 1e6, "Ghz": 1e9}
    return table.get(unit, 1.0)


def _kernel_rows(case_id: str, kernel: str, r: dict[str, str], units: dict[str, str]) -> list:
    out = []

    def val(raw_name: str):
        if raw_name not in r:
            return None
        v = num(r[raw_name])
        if not isinstance(v, float):
            return None
        return v * _unit_scale(units.get(raw_name, ""), "")

    for canon, (raw_name, unit, scale) in M.NCU_METRICS.items():
        v = val(raw_name)
        if v is not None:
            out.append((case_id, "ncu", kernel, canon, v * scale, unit))
    limits = {k: val(raw) for k, raw in M.OCCUPANCY_LIMITS.items()}
    limits = {k: v for k, v in limits.items() if v is not None}
    for k, v in limits.items():
        out.append((case_id, "ncu", kernel, f"occupancy_limit_{k}", v, "blocks"))
    if limits:
        which = min(limits, key=lambda k: (limits[k], k != "registers"))
        out.append((case_id, "ncu", kernel, "occupancy_limiter", limits[which], which))
    flops = {k: val(raw) for k, (raw, _) in M.FLOP_COUNTERS.items()}
    if any(v is not None for v in flops.values()):
        total = sum((v or 0.0) * M.FLOP_COUNTERS[k][1] for k, v in flops.items())
        tensor = sum((v or 0.0) for k, v in flops.items() if k.startswith("flop_tensor"))
        out.append((case_id, "ncu", kernel, "flop_count", total, "flop"))
        out.append((case_id, "ncu", kernel, "flop_count_tensor", tensor, "flop"))
        dur_ns = val("gpu__time_duration.sum")
        if dur_ns:
            out.append((case_id, "ncu", kernel, "achieved_tflops", total / dur_ns / 1e3,
                        "TFLOP/s"))
        rd, wr = val("dram__bytes_read.sum"), val("dram__bytes_write.sum")
        if rd is not None and wr is not None and rd + wr > 0:
            out.append((case_id, "ncu", kernel, "arithmetic_intensity", total / (rd + wr),
                        "flop/byte"))
    return out
