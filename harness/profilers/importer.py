"""`harness import PATH`: bring profiles made elsewhere into the store as a new run.

Accepted: a `.ncu-rep` (read with NVIDIA's ncu_report; with SourceCounters its warp stalls per
source line too), an ncu CSV export (raw or details page, `--print-units base` preferred; live
logs with ==PROF== lines are fine; or the source page, `--page source --print-source cuda,sass`,
which gives source lines only), or a folder of
`nsys stats --format csv` files (nvtx_kern_sum / cuda_gpu_kern_sum ...). Kernels inside a
`harness` NVTX range keep their case id; others become one case per kernel name (op
`imported`). Everything is parsed and validated before the run directory is created, so a
foreign or corrupt file writes nothing.
"""
from __future__ import annotations

import argparse
import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from harness import op_card, store
from harness.errors import ImportFormatError
from harness.store.option import add_store_argument

HELP = ("import a .ncu-rep, an ncu CSV (raw, details or source page) or a folder of nsys "
        "stats CSVs")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="file or folder to import")
    add_store_argument(p, out_alias=True)
    p.add_argument("--name", default=None, help="experiment name for the new run")


def _read(path: Path) -> tuple[str, pd.DataFrame, dict]:
    """(kind, canonical metrics, env facts) or ImportFormatError naming what was expected."""
    from harness.profilers import ncu_parse, nsys

    if not path.exists():
        raise ImportFormatError(f"{path}: no such file or folder")
    if path.is_dir():
        df = nsys.parse_stats_dir(path)
        if df.empty:
            df = nsys.parse_kernel_summary(path)
        if df.empty:
            raise ImportFormatError(f"{path}: no nsys stats CSVs found (expected *_nvtx_kern_sum"
                                    ".csv or *_cuda_gpu_kern_sum.csv from `nsys stats --format "
                                    "csv --output <prefix>`)")
        return "nsys-stats", df, {}
    if path.suffix == ".ncu-rep":
        try:
            df = ncu_parse.parse_report(path)
        except ImportError as exc:
            raise ImportFormatError(f"{path}: {exc}") from None
        except Exception as exc:  # ncu_report raises its own types for unreadable files
            raise ImportFormatError(f"{path}: not a readable Nsight Compute report "
                                    f"({type(exc).__name__}: {exc})") from None
        return "ncu-rep", df, {}
    try:
        text = path.read_text(errors="strict")
    except UnicodeDecodeError:
        raise ImportFormatError(f"{path}: binary file; expected an ncu CSV export, a .ncu-rep "
                                "or a folder of nsys stats CSVs") from None
    errors = []
    for kind, fn in (("ncu-raw", ncu_parse.parse_raw_csv),
                     ("ncu-details", ncu_parse.parse_details_csv)):
        try:
            df = fn(text)
        except ValueError as exc:
            errors.append(str(exc))
            continue
        return kind, df, _csv_env(text)
    from harness.profilers.ncu_source import parse_source_csv

    try:  # the source page: warp stalls per source line, no kernel-level metrics
        parse_source_csv(text)
        return "ncu-source", ncu_parse._frame([]), {}
    except ValueError as exc:
        if "--print-source" in str(exc):
            raise ImportFormatError(f"{path}: {exc}") from None
    raise ImportFormatError(f"{path}: not an ncu CSV export (expected a header starting "
                            f"\"ID\",\"Process ID\" from `ncu --csv --page raw|details`, or "
                            f"\"File Path\" from `--page source --print-source cuda,sass`)")


def _source_lines(path: Path, kind: str) -> pd.DataFrame:
    """Warp stalls per source line in a .ncu-rep with SourceCounters or a source-page CSV."""
    from harness.profilers import ncu_source

    if kind == "ncu-rep":
        return ncu_source.parse_report_lines(path)
    if kind == "ncu-source":
        return ncu_source.parse_source_csv(path.read_text())
    return ncu_source.empty_source_lines()


def _csv_env(text: str) -> dict:
    from harness.profilers.ncu_parse import read_raw_rows

    try:
        _, _, rows = read_raw_rows(text)
    except ValueError:
        return {}
    if not rows:
        return {}
    name = rows[0].get("device__attribute_display_name")
    return {"gpu_name": name} if name else {}


def import_path(path: str | Path, out_root: str | Path, name: str | None = None,
                argv: list[str] | None = None) -> Path:
    path = Path(path)
    kind, df, env = _read(path)
    lines = _source_lines(path, kind)
    if df.empty and lines.empty:
        raise ImportFormatError(f"{path}: no profiled kernels in it")
    df, lines = df.copy(), lines.copy()
    for t in (df, lines):
        orphan = t.case_id == ""
        t.loc[orphan, "case_id"] = t.loc[orphan, "kernel"]  # no harness range: a case per kernel
    case_ids = list(dict.fromkeys([*df.case_id, *lines.case_id]))
    kernels = pd.concat([df[["case_id", "kernel"]], lines[["case_id", "kernel"]]])
    exp_name = name or f"import-{path.stem or path.name}"
    manifest = {
        "experiment": {"name": exp_name, "op": "imported", "baseline": None, "candidates": [],
                       "description": f"imported {kind} from {path}"},
        "experiment_path": None, "imported_from": str(path.resolve()), "import_kind": kind,
        "env": {"device": "import", **env}, "device": "import", "status": "complete",
        "passes": {"import": f"done: {kind}"},
        "command": ["python", "-m", "harness", *(argv or ["import", str(path)])],
        "created_utc": datetime.now(timezone.utc).isoformat(),
        op_card.KEY: {"primary": "gbps", "impls": {}},  # no op: nothing to ask the registry
    }
    run_dir = store.create_run(out_root, exp_name, manifest)
    cases = pd.DataFrame([_case_row(kernels, c) for c in case_ids])
    store.write_table(run_dir, "cases", cases)
    store.write_table(run_dir, "results", pd.DataFrame({"case_id": case_ids}))
    store.write_table(run_dir, "metrics", df)
    if len(lines):
        store.write_table(run_dir, "source_lines", lines)
    dest = store.raw_dir(run_dir, "import")
    if path.is_dir():
        for f in sorted(path.glob("*.csv")):
            shutil.copy2(f, dest / f.name)
    else:
        shutil.copy2(path, dest / path.name)
    return run_dir


def _case_row(df: pd.DataFrame, case_id: str) -> dict:
    """A harness case id (`impl.k=v....dtype`) gives back impl, params and dtype; any other
    case is named after its (first) kernel."""
    from harness.profilers.metrics import short_kernel_name
    from harness.experiment.spec import DTYPE_ALIASES

    row = {"case_id": case_id, "op": "imported", "role": "candidate", "params": "{}",
           "dtype": "", "shape_id": case_id, "status": "ok", "error": None}
    parts = case_id.split(".")
    if len(parts) >= 3 and parts[-1] in DTYPE_ALIASES and all("=" in p for p in parts[1:-1]):
        params = dict(p.split("=", 1) for p in parts[1:-1])
        row.update(impl=parts[0], params=json.dumps(params), dtype=parts[-1],
                   shape_id=".".join(parts[1:]))
        return row
    kernels = [k for k in df[df.case_id == case_id].kernel.unique() if k]
    row["impl"] = short_kernel_name(kernels[0]) if kernels else case_id
    return row
