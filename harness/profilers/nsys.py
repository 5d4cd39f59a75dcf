"""Nsight Systems: which kernels each case launched, their GPU time, and the CUDA API time.

    nsys profile -t cuda,nvtx -s none --cpuctxsw=none -f true -o raw/nsys/report  <worker>
    nsys stats --report cuda_gpu_kern_sum,nvtx_kern_sum,nvtx_sum,cuda_api_sum,...
               --format csv --output raw/nsys/stats --force-export=true raw/nsys/report.nsys-rep

A case's kernels are those whose launch call started inside its NVTX range, on any thread
(cuda_api_trace -> correlation id -> cuda_gpu_trace): nsys' own nvtx_kern_sum projects only the
pushing thread's launches, and a CUDA backward runs on autograd's device thread, so a bwd case
showed no kernel at all. Without the two traces (an import of a user's stats folder) the
projection is used.

nsys is looked for on PATH, in $HARNESS_NSYS, and inside a Nsight Compute install
(`.../host/target-linux-x64/nsys`, whose importer needs libdw/libelf on LD_LIBRARY_PATH).
`nsys profile` can exit 0 without a report (importer failure), so the report file is checked.
"""
from __future__ import annotations

import bisect
import csv
import glob
import io
import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd

from harness.profilers.base import (Availability, Profiler, ProfilerFailed, empty_metrics,
                                    register, run_logged)

REPORT = "report"
STATS_PREFIX = "stats"
REPORTS = ("cuda_gpu_kern_sum", "nvtx_kern_sum", "nvtx_sum", "cuda_api_sum",
           "nvtx_pushpop_trace", "cuda_api_trace", "cuda_gpu_trace")
DOMAIN = "harness"

SEARCH = ("/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
          "/opt/nvidia/nsight-systems/*/bin/nsys", "/usr/local/cuda/bin/nsys",
          "/usr/lib/nsight-systems/bin/nsys")


def find_nsys() -> tuple[str | None, list[str]]:
    looked = ["PATH", "$HARNESS_NSYS", *SEARCH]
    cand = shutil.which("nsys") or os.environ.get("HARNESS_NSYS")
    if cand and not os.path.exists(cand):
        cand = None
    if not cand:
        for pattern in SEARCH:
            hits = sorted(glob.glob(pattern))
            if hits:
                cand = hits[-1]
                break
    return cand, looked


@register
class Nsys(Profiler):
    name = "nsys"
    source = "nsys"

    def availability(self) -> Availability:
        exe, looked = find_nsys()
        if not exe:
            return Availability(False, f"nsys not found (looked in {', '.join(looked)})")
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Availability(False, f"{exe} --version failed: {exc}")
        if out.returncode != 0:
            return Availability(False, f"{exe} --version exited {out.returncode}")
        return Availability(True, f"{exe} ({out.stdout.strip().splitlines()[0]})")

    def command(self, worker_argv: list[str], out_dir: Path, options) -> list[str]:
        exe, _ = find_nsys()
        return [exe or "nsys", "profile", "-t", "cuda,nvtx", "-s", "none", "--cpuctxsw=none",
                "-f", "true", "-o", str(Path(out_dir) / REPORT), *worker_argv]

    def export(self, out_dir: Path) -> None:
        out_dir = Path(out_dir)
        rep = out_dir / f"{REPORT}.nsys-rep"
        if not rep.exists():
            hint = (" (a .qdstrm without .nsys-rep means the importer failed: it needs libdw.so.1"
                    " and libelf.so.1 on LD_LIBRARY_PATH)"
                    if list(out_dir.glob("*.qdstrm")) else "")
            raise ProfilerFailed(f"nsys wrote no report ({rep} missing){hint}")
        for q in out_dir.glob("*.qdstrm"):  # multi-GB intermediate; the .nsys-rep has it all
            q.unlink()
        exe, _ = find_nsys()
        argv = [exe or "nsys", "stats", "--report", ",".join(REPORTS), "--format", "csv",
                "--output", str(out_dir / STATS_PREFIX), "--force-export=true", str(rep)]
        proc = run_logged(argv, out_dir / "export.log", timeout=900)
        if proc.returncode != 0:
            raise ProfilerFailed(f"nsys stats exited {proc.returncode}; see {out_dir}/export.log")

    def parse(self, out_dir: Path) -> pd.DataFrame:
        return parse_stats_dir(Path(out_dir))


def stats_file(out_dir: Path, report: str) -> Path:
    """`<prefix>_<report>.csv` in out_dir: ours use prefix `stats`, a user's may use any."""
    ours = Path(out_dir) / f"{STATS_PREFIX}_{report}.csv"
    if ours.exists():
        return ours
    hits = sorted(Path(out_dir).glob(f"*{report}.csv"))
    return hits[0] if hits else ours


def read_stats_csv(path: Path) -> list[dict[str, str]]:
    """Rows of one `nsys stats --format csv` file (lines before the header are skipped)."""
    text = Path(path).read_text()
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if "," in l and not l.startswith(
        ("Processing", "NOTICE", "Generating", "WARNING", "ERROR"))), None)
    if start is None:
        return []
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def range_case(name: str) -> str:
    """`harness:case` / `:case` / `case` -> case (nsys prints the domain before a colon)."""
    name = (name or "").strip()
    if name.startswith(DOMAIN + ":"):
        return name[len(DOMAIN) + 1:]
    return name[1:] if name.startswith(":") else name


def _f(v) -> float | None:
    try:
        return float(str(v).replace(",", ""))
    except (TypeError, ValueError):
        return None


def parse_stats_dir(out_dir: Path) -> pd.DataFrame:
    """Per case (NVTX range of domain harness): kernels launched, their GPU time, API time."""
    rows = []
    kern = stats_file(out_dir, "nvtx_kern_sum")
    by_window = _kernels_by_window(out_dir)
    if not kern.exists() and by_window is None:
        return empty_metrics()
    per_case: dict[str, dict[str, float]] = {}
    if by_window is not None:  # every thread's launches (a CUDA backward runs on autograd's)
        summary = [(case, k, n, us) for case, ks in by_window.items()
                   for k, (n, us) in ks.items()]
    else:  # nsys' own projection: kernels launched by the thread that pushed the range
        summary = [(range_case(r["NVTX Range"]), r.get("Kernel Name", "?"),
                    _f(r.get("Kern Inst")) or 0.0, (_f(r.get("Total Time (ns)")) or 0.0) / 1e3)
                   for r in read_stats_csv(kern) if r.get("NVTX Range")]  # outside: warm-up
    for case, kname, inst, total_us in summary:
        rows.append((case, "nsys", kname, "kernel_launches", inst, "count"))
        rows.append((case, "nsys", kname, "kernel_time_us", total_us, "us"))
        agg = per_case.setdefault(case, {"kernel_count": 0.0, "gpu_time_us": 0.0,
                                         "distinct_kernels": 0.0})
        agg["kernel_count"] += inst
        agg["gpu_time_us"] += total_us
        agg["distinct_kernels"] += 1
    ranges = stats_file(out_dir, "nvtx_sum")
    if ranges.exists():
        for r in read_stats_csv(ranges):
            case = range_case(r.get("Range", ""))
            if case in per_case:
                avg = _f(r.get("Avg (ns)"))
                if avg is not None:
                    per_case[case]["range_wall_us"] = avg / 1e3
    for case, times in _api_time_per_range(out_dir).items():
        if case in per_case:
            per_case[case].update(times)
    units = {"kernel_count": "count", "gpu_time_us": "us", "distinct_kernels": "count",
             "range_wall_us": "us", "api_time_us": "us", "launch_api_us": "us"}
    for case, agg in per_case.items():
        for name, v in agg.items():
            rows.append((case, "nsys", "", name, v, units[name]))
    return pd.DataFrame(rows, columns=["case_id", "source", "kernel", "name", "value", "unit"])


def _spans(out_dir: Path) -> list[tuple[float, float, str]]:
    """(start ns, end ns, case) of every harness range, sorted."""
    ranges_f = stats_file(out_dir, "nvtx_pushpop_trace")
    if not ranges_f.exists():
        return []
    spans = []
    for r in read_stats_csv(ranges_f):
        start, end = _f(r.get("Start (ns)")), _f(r.get("End (ns)"))
        name = r.get("Name") or r.get("Range") or ""
        if start is not None and end is not None and name:
            spans.append((start, end, range_case(name)))
    return sorted(spans)


def _case_at(spans: list[tuple[float, float, str]]):
    """t (ns) -> the case whose range holds t, else None. The worker opens one case's range at
    a time, so the sorted ranges do not overlap: the last that starts at or before t is it."""
    starts = [s for s, _, _ in spans]

    def at(t: float) -> str | None:
        i = bisect.bisect_right(starts, t) - 1
        return spans[i][2] if i >= 0 and t <= spans[i][1] else None
    return at


def _col(row: dict, *names: str) -> str | None:
    """A column by any of its spellings (nsys writes CorrID in one report, CorrId in another)."""
    low = {k.lower(): v for k, v in row.items() if k}
    return next((low[n.lower()] for n in names if n.lower() in low), None)


def _kernels_by_window(out_dir: Path) -> dict[str, dict[str, tuple[float, float]]] | None:
    """case -> kernel name -> (launches, GPU time us): kernels whose launch call (any thread)
    started inside the case's range, joined to the per-kernel GPU trace by correlation id.
    The worker runs one case's range at a time and synchronizes before closing it, so a launch
    inside the window belongs to the case whichever thread made it. None without the traces."""
    api_f, gpu_f = stats_file(out_dir, "cuda_api_trace"), stats_file(out_dir, "cuda_gpu_trace")
    spans = _spans(out_dir)
    if not (api_f.exists() and gpu_f.exists() and spans):
        return None
    at = _case_at(spans)
    case_of: dict[str, str] = {}  # correlation id -> case
    for r in read_stats_csv(api_f):
        start, corr = _f(r.get("Start (ns)")), _col(r, "CorrID", "CorrId")
        if start is None or corr is None or "Launch" not in (r.get("Name") or ""):
            continue
        case = at(start)
        if case is not None:
            case_of[str(corr).strip()] = case
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for r in read_stats_csv(gpu_f):
        name = r.get("Name") or ""
        case = case_of.get(str(_col(r, "CorrId", "CorrID") or "").strip())
        if case is None or name.startswith("[CUDA "):  # memcpy / memset rows
            continue
        n, us = out.setdefault(case, {}).get(name, (0.0, 0.0))
        out[case][name] = (n + 1, us + (_f(r.get("Duration (ns)")) or 0.0) / 1e3)
    return out


def _api_time_per_range(out_dir: Path) -> dict[str, dict[str, float]]:
    """CUDA API time inside each case's range, from the range and API traces:
    api_time_us (every call, the final synchronize included) and launch_api_us (kernel
    launch calls only: the host cost of launching the case's kernels)."""
    api_f = stats_file(out_dir, "cuda_api_trace")
    spans = _spans(out_dir)
    out: dict[str, dict[str, float]] = {}
    if not (spans and api_f.exists()):
        return out
    at = _case_at(spans)
    for r in read_stats_csv(api_f):
        start, dur = _f(r.get("Start (ns)")), _f(r.get("Duration (ns)"))
        case = at(start) if start is not None and dur is not None else None
        if case is None:
            continue
        t = out.setdefault(case, {"api_time_us": 0.0, "launch_api_us": 0.0})
        t["api_time_us"] += dur / 1e3
        if "Launch" in (r.get("Name") or ""):
            t["launch_api_us"] += dur / 1e3
    return out


def parse_kernel_summary(out_dir: Path) -> pd.DataFrame:
    """Without NVTX ranges: one 'case' per kernel name from cuda_gpu_kern_sum (for import)."""
    path = stats_file(out_dir, "cuda_gpu_kern_sum")
    if not path.exists():
        return empty_metrics()
    rows = []
    for r in read_stats_csv(path):
        name = r.get("Name")
        if not name:
            continue
        inst, tot = _f(r.get("Instances")) or 0.0, (_f(r.get("Total Time (ns)")) or 0.0) / 1e3
        rows += [(name, "nsys", name, "kernel_launches", inst, "count"),
                 (name, "nsys", name, "kernel_time_us", tot, "us"),
                 (name, "nsys", "", "kernel_count", inst, "count"),
                 (name, "nsys", "", "gpu_time_us", tot, "us")]
    return pd.DataFrame(rows, columns=["case_id", "source", "kernel", "name", "value", "unit"])
