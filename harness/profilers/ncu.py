"""Nsight Compute: one report per run pass, exported to CSV, parsed into canonical metrics.

    ncu --nvtx --nvtx-include regex:harness@.+/ --section ... --metrics ...
        --cache-control all --clock-control none --target-processes all --replay-mode kernel
        -f -o raw/ncu/report  python -m harness worker --passes profile --tag ncu ...
    ncu --import raw/ncu/report.ncu-rep --csv --page raw --print-units base   > raw.csv
    ncu --import raw/ncu/report.ncu-rep --csv --page details --print-units base > details.csv

With `source_lines` on (the default when a profiled case is a Triton impl), the pass adds the
PC-sampling metrics of the SourceCounters section (SOURCE_SAMPLING) and `--import-source yes`,
and the lines come out of the report (profilers/ncu_source.py) into the store's `source_lines`
table.

`--clock-control none` always: never change the card's clocks (shared GPUs); the clocks the
kernels ran at are recorded as sm_clock_hz. The .ncu-rep stays for the Nsight Compute UI.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

from harness.profilers import metrics as M
from harness.profilers.base import (Availability, Profiler, ProfilerFailed, empty_metrics,
                                    register, run_logged)
from harness.profilers.ncu_parse import (_Kernels, _nvtx_col, nvtx_case, parse_raw_csv,
                                        read_raw_rows)
from harness.profilers.ncu_source import SECTION as SOURCE_SECTION
from harness.profilers.ncu_source import parse_report_lines, parse_source_csv

# What the source_lines table reads (profilers/ncu_source.py): the PC-sampled warp states per
# SASS instruction, without the rest of the SourceCounters section (its per-instruction
# execution and memory counts, for every kernel of a profiled case: 2 more replay passes per
# kernel; flash_bwd.yaml's six ncu cases on an H100 ran 35.7 s with the whole section, 28.4 s
# with its sampling alone). HARNESS_NCU_SOURCE=section collects the whole section, as
# `sections: [SourceCounters]` in the YAML does.
SOURCE_SAMPLING = ("group:smsp__pcsamp_warp_stall_reasons", "smsp__pcsamp_sample_count")
SOURCE_ENV = "HARNESS_NCU_SOURCE"
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
    tables = ("source_lines",)

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
        # process scope: a case's range also covers kernels launched by other threads of the
        # worker (autograd runs a CUDA backward on its own device thread); one range at a time
        argv = [exe or "ncu", "--nvtx", "--nvtx-include", NVTX_INCLUDE,
                "--nvtx-push-pop-scope", "process"]
        for s in options.sections:
            argv += ["--section", s]
        self.source_lines = options.source_lines is True  # "auto" is settled by prepare()
        extra = set(M.extra_ncu_metrics()) | set(options.metrics)
        if self.source_lines:  # PC-sampled stalls per SASS instruction -> source lines
            named = SOURCE_SECTION in options.sections  # the whole section, already asked
            if not named and os.environ.get(SOURCE_ENV) == "section":
                argv += ["--section", SOURCE_SECTION]
            elif not named:  # only what the source_lines table reads of it
                extra |= set(SOURCE_SAMPLING)
            argv += ["--import-source", "yes"]
        extra = sorted(extra)
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

        def page_csv(page: str, extra: list[str]):
            argv = [exe or "ncu", "--import", str(rep), "--csv", "--page", page,
                    "--print-units", "base", *extra]
            return run_logged(argv, out_dir / "export.log", timeout=600,
                              stdout_path=out_dir / f"{page}.csv")

        # the two pages are read side by side: each `ncu --import` parses the whole report
        with ThreadPoolExecutor(2) as pool:
            procs = dict(zip(("raw", "details"), pool.map(
                page_csv, ("raw", "details"), ([], ["--print-details", "all"]))))
        for page, proc in procs.items():
            if proc.returncode != 0:
                raise ProfilerFailed(f"ncu --import --page {page} exited {proc.returncode}; "
                                     f"see {out_dir}/export.log")

    def parse(self, out_dir: Path) -> pd.DataFrame:
        path = Path(out_dir) / "raw.csv"
        if not path.exists():
            return empty_metrics()
        return parse_raw_csv(path.read_text())

    # -- source lines (SourceCounters) -----------------------------------------------------------
    def prepare(self, options, cases: pd.DataFrame, case_ids: list[str]):
        if options.source_lines != "auto":
            return options
        return options.model_copy(update={"source_lines": any_triton(cases, case_ids)})

    def extra_tables(self, out_dir: Path) -> dict[str, pd.DataFrame]:
        """`source_lines` from the report: through ncu_report, else the source-page CSV."""
        rep = Path(out_dir) / f"{REPORT}.ncu-rep"
        if not getattr(self, "source_lines", False) or not rep.exists():
            return {}
        try:
            return {"source_lines": parse_report_lines(rep, self._raw_cases(Path(out_dir)))}
        except ImportError:
            pass
        return {"source_lines": self._source_lines_from_csv(Path(out_dir), rep)}

    @staticmethod
    def _raw_cases(out_dir: Path) -> list[str]:
        """The case of each result of the report, in order, as the raw page names it (its
        NVTX column holds the process-wide ranges: a kernel launched by autograd's own thread
        is in its case's range there, not in the report's per-thread NVTX state)."""
        path = out_dir / "raw.csv"
        if not path.exists():
            return []
        header, _, rows = read_raw_rows(path.read_text())
        col = _nvtx_col(header)
        return [(nvtx_case(r.get(col, "")) if col else None) or "" for r in rows]

    def _source_lines_from_csv(self, out_dir: Path, rep: Path) -> pd.DataFrame:
        """One `--page source` export of all results; its kernels, in order, are the raw page's
        rows, which name the cases (the source page has no NVTX column)."""
        exe, _ = find_ncu()
        path = out_dir / "source.csv"
        argv = [exe or "ncu", "--import", str(rep), "--csv", "--page", "source",
                "--print-source", "cuda,sass", "--print-units", "base"]
        proc = run_logged(argv, out_dir / "export.log", timeout=600, stdout_path=path)
        if proc.returncode != 0:
            raise ProfilerFailed(f"ncu --import --page source exited {proc.returncode}; "
                                 f"see {out_dir}/export.log")
        df = parse_source_csv(path.read_text())
        cases = self._raw_cases(out_dir)
        kernels = list(dict.fromkeys(df.kernel))
        if len(kernels) == len(cases):  # relabel per case, as the raw page's parser does
            names = _Kernels()
            relabel = {k: (c, names.label(c, k.split(" #")[0])) for k, c in zip(kernels, cases)}
            df["case_id"] = df.kernel.map(lambda k: relabel[k][0])
            df["kernel"] = df.kernel.map(lambda k: relabel[k][1])
        return df


def any_triton(cases: pd.DataFrame, case_ids: list[str]) -> bool:
    """Whether one of these cases runs an impl registered with backend "triton"."""
    from harness.registry import registry

    sel = cases[cases.case_id.isin(case_ids)] if len(cases) else cases
    for op_name, impl, base_impl in {(r.op, r.impl, getattr(r, "base_impl", None))
                                     for r in sel.itertuples()}:
        try:
            op = registry().get_op(op_name)
        except Exception:  # an op that no longer imports: no decision from it
            continue
        # variants and named configs run base_impl (older runs: impl[k=v,...] or impl)
        base = base_impl if isinstance(base_impl, str) and base_impl else str(impl).split("[")[0]
        if base in op.impls and op.impls[base].backend == "triton":
            return True
    return False


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
