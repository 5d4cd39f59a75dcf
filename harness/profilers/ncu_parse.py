"""Nsight Compute output -> canonical long-format metrics (one block of rows per kernel).

Three readers, one mapping (profilers/metrics.py): the raw page (`--csv --page raw`, exported
or live with ==PROF== and application lines around it), the details page (`--csv --page
details`, label names), and the .ncu-rep itself through NVIDIA's `ncu_report` module (PyPI
`ncu-report`, or extras/python of an Nsight Compute install). All give the same values.

Kernels are mapped to cases through the NVTX push/pop range of domain `harness` (the case id);
a kernel outside any harness range keeps case_id "".
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pandas as pd

from harness.profilers import metrics as M

NA = {"", "n/a", "N/A", "(!) n/a", "nan", "no data"}
DOMAIN = "harness"
COLUMNS = ["case_id", "source", "kernel", "name", "value", "unit"]
_NVTX_ITEM = re.compile(r'"([^"]*?):([^:"]*):[^"]*"')
_UNIT_SCALE = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6,
               "msecond": 1e6, "s": 1e9, "second": 1e9, "byte": 1.0, "Kbyte": 1e3,
               "Mbyte": 1e6, "Gbyte": 1e9, "hz": 1.0, "Khz": 1e3, "Mhz": 1e6, "Ghz": 1e9,
               "Kbyte/block": 1e3, "byte/block": 1.0}


def num(s: str):
    """ncu CSV number: thousands separators stripped; n/a -> None; other text kept as text."""
    t = (s or "").strip()
    if t in NA:
        return None
    try:
        return float(t.replace(",", ""))
    except ValueError:
        return t


def to_base(value: float, unit: str) -> float:
    """A value printed in `unit` in base units (exports without --print-units base scale)."""
    return value * _UNIT_SCALE.get(unit or "", 1.0)


def nvtx_case(cell: str, domain: str = DOMAIN) -> str | None:
    """The innermost push/pop range of `domain` in an ncu NVTX cell (the case id)."""
    names = [rng for dom, rng in _NVTX_ITEM.findall(cell or "") if dom == domain]
    return names[-1] if names else None


def canonical_rows(case_id: str, kernel: str, raw: dict[str, float], source: str = "ncu"):
    """Canonical rows for one kernel from its raw metrics (raw name -> base-unit value)."""
    out = []
    for canon, (_, unit, scale) in M.NCU_METRICS.items():
        v = next((raw[r] for r in M.raw_names(canon) if raw.get(r) is not None), None)
        if v is not None:
            out.append((case_id, source, kernel, canon, v * scale, unit))
    limits = {k: raw[r] for k, r in M.OCCUPANCY_LIMITS.items() if raw.get(r) is not None}
    for k, v in limits.items():
        out.append((case_id, source, kernel, f"occupancy_limit_{k}", v, "blocks"))
    if limits:  # the resource allowing the fewest blocks; registers win ties (most actionable)
        which = min(limits, key=lambda k: (limits[k], k != "registers"))
        out.append((case_id, source, kernel, "occupancy_limiter", limits[which], which))
    flops = {k: raw.get(r) for k, (r, _) in M.FLOP_COUNTERS.items()}
    if any(v is not None for v in flops.values()):
        total = sum((v or 0.0) * M.FLOP_COUNTERS[k][1] for k, v in flops.items())
        tensor = sum((v or 0.0) for k, v in flops.items() if k.startswith("flop_tensor"))
        out.append((case_id, source, kernel, "flop_count", total, "flop"))
        out.append((case_id, source, kernel, "flop_count_tensor", tensor, "flop"))
        dur_ns = raw.get("gpu__time_duration.sum")
        if dur_ns:
            out.append((case_id, source, kernel, "achieved_tflops", total / dur_ns / 1e3,
                        "TFLOP/s"))
        rd, wr = raw.get("dram__bytes_read.sum"), raw.get("dram__bytes_write.sum")
        if rd is not None and wr is not None and rd + wr > 0:
            out.append((case_id, source, kernel, "arithmetic_intensity", total / (rd + wr),
                        "flop/byte"))
    return out


class _Kernels:
    """Numbers repeated kernels of one case: `name`, `name #2`, ..."""

    def __init__(self):
        self.seen: dict[tuple[str, str], int] = {}

    def label(self, case_id: str, name: str) -> str:
        name = M.short_kernel_name(name)  # ncu CSV, ncu_report and nsys spell names differently
        k = (case_id, name)
        self.seen[k] = self.seen.get(k, 0) + 1
        return name if self.seen[k] == 1 else f"{name} #{self.seen[k]}"


def _frame(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=COLUMNS)


def _csv_from(text: str, header_prefix: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith(header_prefix)), None)
    if start is None:
        raise ValueError(f"no ncu CSV header ({header_prefix}...) found")
    return list(csv.reader(io.StringIO("\n".join(lines[start:]))))


# -- raw page ------------------------------------------------------------------------------------

def read_raw_rows(text: str) -> tuple[list[str], dict[str, str], list[dict[str, str]]]:
    """(header, units by column, rows) of a raw-page CSV. Lines before the header (==PROF==,
    application output) and later lines with the wrong number of fields are skipped."""
    rows = _csv_from(text, '"ID","Process ID"')
    header = rows[0]
    if "Kernel Name" not in header or "Section Name" in header:
        raise ValueError("not a raw-page ncu CSV (expected one column per metric)")
    if len(rows) < 2:
        return header, {}, []
    has_units = rows[1][:2] == ["", ""]
    units = dict(zip(header, rows[1])) if has_units else {}
    body = rows[2:] if has_units else rows[1:]
    return header, units, [dict(zip(header, r)) for r in body if len(r) == len(header)]


def _nvtx_col(header: list[str]) -> str | None:
    return next((h for h in header if h.startswith("thread Domain:Push/Pop_Range")), None)


def parse_raw_csv(text: str) -> pd.DataFrame:
    header, units, data = read_raw_rows(text)
    col = _nvtx_col(header)
    names = _Kernels()
    rows = []
    for r in data:
        case_id = (nvtx_case(r.get(col, "")) if col else None) or ""
        raw = {}
        for k, v in r.items():
            x = num(v)
            if isinstance(x, float):
                raw[k] = to_base(x, units.get(k, ""))
        rows.extend(canonical_rows(case_id, names.label(case_id, r.get("Kernel Name", "?")),
                                   raw))
    return _frame(rows)


# -- details page --------------------------------------------------------------------------------

def parse_details_csv(text: str) -> pd.DataFrame:
    rows = _csv_from(text, '"ID","Process ID"')
    header = rows[0]
    need = ("Section Name", "Metric Name", "Metric Unit", "Metric Value")
    if not all(h in header for h in need):
        raise ValueError("not a details-page ncu CSV (no Section Name/Metric Name/Metric Value)")
    ix = {h: i for i, h in enumerate(header)}
    col = _nvtx_col(header)
    kernels: dict[str, dict] = {}
    for r in rows[1:]:
        if len(r) <= ix["Metric Value"] or not r[ix["Metric Name"]]:
            continue  # rule rows and section header rows
        k = kernels.setdefault(r[ix["ID"]], {
            "case": (nvtx_case(r[ix[col]]) if col else None) or "",
            "name": r[ix["Kernel Name"]], "raw": {}, "smem": 0.0, "smem_seen": False})
        section, label = r[ix["Section Name"]], r[ix["Metric Name"]]
        body = r[ix["Body Item Label"]] if "Body Item Label" in ix else ""
        v = num(r[ix["Metric Value"]])
        if not isinstance(v, float):
            continue
        v = to_base(v, r[ix["Metric Unit"]])
        if section == M.DETAILS_COMMAND_LINE_SECTION:
            k["raw"][label] = v
        elif body and section == "Warp State Statistics":
            raw_name = M.stall_label_to_raw(label)
            if raw_name:
                k["raw"].setdefault(raw_name, v)
        elif (section, label) in M.NCU_DETAILS_LABELS:
            k["raw"].setdefault(M.NCU_DETAILS_LABELS[(section, label)], v)
        elif section == "Launch Statistics" and label in M.NCU_DETAILS_SHARED_MEM:
            k["smem"] += v
            k["smem_seen"] = True
    names = _Kernels()
    out = []
    for k in kernels.values():
        if k["smem_seen"]:
            k["raw"].setdefault("launch__shared_mem_per_block", k["smem"])
        out.extend(canonical_rows(k["case"], names.label(k["case"], k["name"]), k["raw"]))
    return _frame(out)


# -- .ncu-rep through ncu_report -------------------------------------------------------------------

def load_ncu_report_module():
    """NVIDIA's `ncu_report`: the PyPI wheel, else extras/python of an Nsight Compute install."""
    try:
        import ncu_report  # noqa: F401

        return ncu_report
    except ImportError:
        pass
    import glob
    import importlib
    import sys

    for d in sorted(glob.glob("/opt/nvidia/nsight-compute/*/extras/python"), reverse=True):
        sys.path.insert(0, d)
        try:
            return importlib.import_module("ncu_report")
        except ImportError:
            sys.path.remove(d)
    raise ImportError("ncu_report not found: `pip install ncu-report` or install Nsight Compute")


def parse_report(path: str | Path) -> pd.DataFrame:
    ncu_report = load_ncu_report_module()
    ctx = ncu_report.load_report(str(path))
    wanted = ({r for c in M.NCU_METRICS for r in M.raw_names(c)}
              | set(M.OCCUPANCY_LIMITS.values()) | {r for r, _ in M.FLOP_COUNTERS.values()})
    names = _Kernels()
    out = []
    for ri in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(ri)
        for ai in range(rng.num_actions()):
            a = rng.action_by_idx(ai)
            case_id = ""
            st = a.nvtx_state()
            for d in st.domains():
                info = st.domain_by_id(d)
                if info.name() == DOMAIN and info.push_pop_ranges():
                    case_id = info.push_pop_ranges()[-1]
            present = set(a.metric_names())
            raw = {}
            for name in wanted & present:
                v = a[name].value()
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    raw[name] = to_base(float(v), a[name].unit())
            kname = a.name()  # function name
            out.extend(canonical_rows(case_id, names.label(case_id, kname), raw))
    return _frame(out)
