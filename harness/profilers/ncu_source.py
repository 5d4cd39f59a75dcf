"""Warp-stall samples on the kernel's source lines (ncu SourceCounters) -> long-format rows.

ncu's SourceCounters section samples warp program counters (PC sampling) and records, per SASS
instruction, how many samples landed there and in which warp state. Through the line info that
Triton emits, every instruction belongs to a line of the kernel's Python source (or of Triton's
own library, e.g. `triton/language/standard.py` for `tl.max`). Two readers, one result:

    .ncu-rep  (ncu_report)  per-PC instanced metrics smsp__pcsamp_sample_count and
                            smsp__pcsamp_warps_issue_stalled_<reason>; action.source_info(pc)
                            -> (file, line); action.source_files() -> embedded source text
                            (`--import-source yes`)
    CSV       `ncu --import R --csv --page source --print-source cuda,sass --print-units base`:
              per file a block  "File Path",<path> / "Function Name",<kernel> / header
              "Line No","Source","Address","Source",<metrics>  then one row per source line
              (with the line's totals) followed by its SASS rows (Line No empty)

One row per (case, kernel, file, line) with samples > 0 (columns SOURCE_LINE_COLUMNS):
samples = all PC samples on the line ("Warp Stall Sampling (All Samples)", `selected` i.e.
issuing included, as ncu counts them), share = samples / all samples of the kernel,
stall_mix = JSON {canonical reason: samples} (largest first), library = the line is in Triton's
own package rather than in the kernel's file.
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pandas as pd

from harness.profilers import metrics as M
from harness.profilers.ncu_parse import DOMAIN, _Kernels, load_ncu_report_module, num
from harness.store import SOURCE_LINE_COLUMNS

SECTION = "SourceCounters"
SAMPLES = "smsp__pcsamp_sample_count"
REASON_PREFIX = "smsp__pcsamp_warps_issue_stalled_"
CSV_SAMPLES = "Warp Stall Sampling (All Samples)"
_LIBRARY = re.compile(r"(^|/)(site|dist)-packages/triton/|(^|/)triton/language/")


def is_library(path: str) -> bool:
    """A file of Triton's own package (triton/language/*.py and the rest of site-packages/triton)."""
    return bool(_LIBRARY.search((path or "").replace("\\", "/")))


def empty_source_lines() -> pd.DataFrame:
    return pd.DataFrame(columns=SOURCE_LINE_COLUMNS)


def _file_lines(path: str, embedded: dict[str, str]) -> list[str] | None:
    if path in embedded:
        return embedded[path].splitlines()
    try:
        return Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return None


def _rows(case_id: str, kernel: str, lines: dict[tuple[str, int], dict], total: float,
          texts: dict[str, list[str] | None] | None = None) -> list[dict]:
    """Rows of one kernel from {(file, line): {"samples", "mix", "text"}}."""
    out = []
    for (path, line), d in lines.items():
        if d["samples"] <= 0 or not path or int(line) <= 0:
            continue  # no line info (a library kernel without -lineinfo): nothing to point at
        text = d.get("text")
        if text is None and texts is not None:
            src = texts.get(path)
            text = src[line - 1] if src and 0 < line <= len(src) else ""
        mix = {r: v for r, v in sorted(d["mix"].items(), key=lambda kv: (-kv[1], kv[0])) if v > 0}
        out.append({"case_id": case_id, "kernel": kernel, "file": path, "line": int(line),
                    "text": (text or "").rstrip(), "samples": float(d["samples"]),
                    "share": d["samples"] / total if total else 0.0,
                    "stall_mix": json.dumps(mix), "library": is_library(path)})
    return out


def _frame(rows: list[dict]) -> pd.DataFrame:
    if not rows:
        return empty_source_lines()
    df = pd.DataFrame(rows, columns=SOURCE_LINE_COLUMNS)
    df["line"] = df["line"].astype("int64")
    df["library"] = df["library"].astype(bool)
    order = df.groupby(["case_id", "kernel"], sort=False).ngroup()
    return (df.assign(_k=order).sort_values(["_k", "samples", "file", "line"],
                                            ascending=[True, False, True, True])
            .drop(columns="_k").reset_index(drop=True))


# -- .ncu-rep through ncu_report -------------------------------------------------------------------

def _action_case(action) -> str:
    st = action.nvtx_state()
    case_id = ""
    for d in st.domains():
        info = st.domain_by_id(d)
        if info.name() == DOMAIN and info.push_pop_ranges():
            case_id = info.push_pop_ranges()[-1]
    return case_id


def _per_pc(metric) -> dict[int, float]:
    ids = metric.correlation_ids()
    return {ids.as_uint64(i): float(metric.as_uint64(i)) for i in range(metric.num_instances())}


def parse_report_lines(path: str | Path, raw_cases: list[str] | None = None) -> pd.DataFrame:
    """Source lines of every kernel in a .ncu-rep collected with PC sampling (SourceCounters;
    kernels without PC samples give no rows). `raw_cases`: each result's case as the raw page
    names it, in order, for a kernel whose own NVTX state has no case range (one launched by
    another thread of the process: autograd's, in a backward)."""
    ncu_report = load_ncu_report_module()
    ctx = ncu_report.load_report(str(path))
    names = _Kernels()
    rows: list[dict] = []
    k = -1
    for ri in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(ri)
        for ai in range(rng.num_actions()):
            a = rng.action_by_idx(ai)
            k += 1
            case_id = _action_case(a) or (raw_cases[k] if raw_cases and k < len(raw_cases)
                                          else "")
            kernel = names.label(case_id, a.name())  # same labels as ncu_parse.parse_report
            present = set(a.metric_names())
            if SAMPLES not in present or a[SAMPLES].num_instances() == 0:
                continue
            samples = _per_pc(a[SAMPLES])
            reasons = {M.pcsamp_reason(n[len(REASON_PREFIX):]): _per_pc(a[n]) for n in present
                       if n.startswith(REASON_PREFIX) and not n.endswith("_not_issued")}
            embedded = {k: a.source_files()[k] for k in a.source_files()}
            lines: dict[tuple[str, int], dict] = {}
            for pc, n in samples.items():
                info = a.source_info(pc)
                key = (info.file_name(), int(info.line())) if info is not None else ("", 0)
                d = lines.setdefault(key, {"samples": 0.0, "mix": {}})
                d["samples"] += n
                for r, by_pc in reasons.items():
                    v = by_pc.get(pc, 0.0)
                    if v:
                        d["mix"][r] = d["mix"].get(r, 0.0) + v
            texts = {f: _file_lines(f, embedded) for f, _ in lines}
            rows += _rows(case_id, kernel, lines, sum(samples.values()), texts)
    return _frame(rows)


# -- source-page CSV -------------------------------------------------------------------------------

def _one_row(line: str) -> list[str]:
    return next(csv.reader([line]), [])


def _split_line_row(line: str, n_fields: int) -> list[str] | None:
    """A source-line row of the source page. ncu does not escape quotes inside the source text
    (`other=-float("inf")`), so the row is cut at `","` from both ends around the text."""
    if not (line.startswith('"') and line.endswith('"')):
        return None
    body = line[1:-1]
    head, sep, rest = body.partition('","')
    if not sep:
        return None
    tail = rest.rsplit('","', n_fields - 2)
    if len(tail) != n_fields - 1:
        return None
    return [head, *tail]


def parse_source_csv(text: str, case_id: str = "") -> pd.DataFrame:
    """Source lines from `ncu --import R --csv --page source --print-source cuda,sass
    --print-units base`. A kernel is a run of "File Path" blocks with one "Function Name"; a file
    seen again for the same function starts the next kernel (export one result per file,
    `--launch-skip i --launch-count 1`, to be unambiguous). `--print-source cuda` alone prints
    the source text without any metrics and is refused."""
    lines = text.splitlines()
    if not any(l.startswith('"File Path"') for l in lines):
        if any(l.startswith('"File Name"') for l in lines):
            raise ValueError("ncu source page without metrics (exported with --print-source "
                             "cuda); export with --print-source cuda,sass")
        raise ValueError('not an ncu source-page CSV (no "File Path" rows from '
                         '`ncu --import R --csv --page source --print-source cuda,sass`)')
    kernels: list[dict] = []  # {"name", "lines", "files"}
    cur, path, header = None, "", None
    for raw in lines:
        if raw.startswith('"File Path"'):
            r = _one_row(raw)
            path, header = (r[1] if len(r) > 1 else ""), None
        elif raw.startswith('"Function Name"'):
            r = _one_row(raw)
            fn = r[1] if len(r) > 1 else "?"
            if cur is None or cur["name"] != fn or path in cur["files"]:
                cur = {"name": fn, "lines": {}, "files": set()}
                kernels.append(cur)
            cur["files"].add(path)
        elif raw.startswith('"Line No"'):
            header = _one_row(raw)
        elif header is not None and cur is not None and re.match(r'^"\d', raw):
            r = _split_line_row(raw, len(header))
            if r is not None:  # SASS rows (Line No empty) and "..." elisions are skipped:
                _add_csv_line(cur, path, header, r)  # the line rows carry the totals
    names = _Kernels()
    out: list[dict] = []
    for k in kernels:
        total = sum(d["samples"] for d in k["lines"].values())
        out += _rows(case_id, names.label(case_id, k["name"]), k["lines"], total)
    return _frame(out)


def _add_csv_line(cur: dict, path: str, header: list[str], r: list[str]) -> None:
    rec = dict(zip(header[4:], r[4:]))
    n = num(rec.get(CSV_SAMPLES, ""))
    if not isinstance(n, float):
        return
    line = int(float(r[0].replace(",", "")))
    d = cur["lines"].setdefault((path, line), {"samples": 0.0, "mix": {}, "text": r[1]})
    d["samples"] += n
    for col, v in rec.items():
        if col.startswith("stall_") and not col.endswith("(Not Issued)"):
            x = num(v)
            if isinstance(x, float) and x:
                reason = M.pcsamp_reason(col[len("stall_"):])
                d["mix"][reason] = d["mix"].get(reason, 0.0) + x


def top_lines(df: pd.DataFrame, n: int = 5) -> pd.DataFrame:
    """The n lines with the most samples per (case, kernel), in stored order."""
    if df.empty:
        return df
    return (df.sort_values("samples", ascending=False, kind="stable")
            .groupby(["case_id", "kernel"], sort=False).head(n)
            .sort_values(["case_id", "kernel", "samples"], ascending=[True, True, False],
                         kind="stable").reset_index(drop=True))


def mix_text(stall_mix: str | dict, samples: float, n: int = 2) -> str:
    """'long_scoreboard 60 %, barrier 30 %' — the line's largest stall reasons."""
    mix = json.loads(stall_mix) if isinstance(stall_mix, str) else dict(stall_mix or {})
    if not samples:
        return ""
    top = sorted(mix.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{r} {v / samples * 100:.0f} %" for r, v in top)
