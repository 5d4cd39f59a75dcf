"""The report's compact view: implementation x shape, one cell per case.

Rows are the shapes (parameters that vary across the run, in sweep order) with the dtype as a
column; columns are the implementations, baseline first. A run of more implementations than
twice its shapes (a config grid: one shape, dozens of variants) is turned on its side: a row per
implementation, baseline first and then fastest first (by the primary metric of the first
shape), a column per shape. A GPU cell holds the op's primary
metric (TFLOP/s for compute ops, GB/s for memory ops: `Op.primary`) and the speedup vs the
baseline with its significance mark; the best cell of a row (highest primary metric among the
correct cases) is bold. A CPU cell holds the correctness status only: interpreter timings say
nothing about speed.
"""
from __future__ import annotations

import json

import pandas as pd

from harness.present.show import _v
from harness.experiment.spec import DTYPE_SHORT
from harness.values import finite as _n

STATUS = {"failed": "✗ failed", "error": "error", "skipped": "skipped", "pending": "pending",
          "timeout": "timeout"}


def varying(params: dict, fixed: dict) -> str:
    """`B=16 N=1024 D=64 causal=false`: the parameters not shared by every case."""
    return " ".join(f"{k}={_v(v)}" for k, v in params.items() if k not in fixed)


def fmt_rate(x: float) -> str:
    """Three significant digits, thousands separated: 1,234 / 406 / 69.6 / 4.21."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def speedup_short(r: dict) -> str:
    """`5.84x` when significant (faster or slower), `≈1.00x` when the same within the band,
    `1.03x?` when not significant or untested."""
    mark = r.get("speedup_mark")
    sp = _n(r.get("speedup_ratio")) if mark else _n(r.get("speedup_vs_baseline"))
    if sp is None:
        return ""
    if mark in ("faster", "slower"):
        return f"{sp:.2f}x"
    if mark == "same":
        return f"≈{sp:.2f}x"
    return f"{sp:.2f}x?"


def _cell(r: dict | None, cpu: bool, primary: str) -> tuple[str, float | None]:
    """(text, value used to rank the row) for one case."""
    if r is None:
        return "-", None
    if r["status"] != "ok":
        return STATUS.get(r["status"], r["status"]), None
    if cpu:
        return "✓", None
    thr = _n(r.get(primary))
    parts = [fmt_rate(thr)] if thr is not None else []
    if r["role"] != "baseline":
        sp = speedup_short(r)
        if sp:
            parts.append(sp)
    return " · ".join(parts) or "✓", thr


def pivot(df: pd.DataFrame, *, cpu: bool, primary: str, fixed: dict) -> dict:
    """{columns, rows, align} (report_context.table's shape) plus `best` counts per impl."""
    impls = list(dict.fromkeys(
        [*df[df.role == "baseline"].impl, *df[df.role != "baseline"].impl]))
    by_key: dict[tuple[str, str], dict[str, dict]] = {}
    for r in df.to_dict("records"):
        key = (json.dumps(r["params"], sort_keys=True), r["dtype"])
        by_key.setdefault(key, {"_params": r["params"], "_dtype": r["dtype"]})[r["impl"]] = r
    rows, best_count = [], dict.fromkeys(impls, 0)
    for cells_by_impl in by_key.values():
        label = varying(cells_by_impl["_params"], fixed) or "(every case)"
        cells = [_cell(cells_by_impl.get(i), cpu, primary) for i in impls]
        ranked = [v for _, v in cells if v is not None]
        top = max(ranked) if ranked else None
        row = [label, DTYPE_SHORT.get(cells_by_impl["_dtype"], cells_by_impl["_dtype"])]
        for impl, (text, v) in zip(impls, cells):
            if top is not None and v == top and len(ranked) > 1:
                row.append(f"**{text}**")
                best_count[impl] += 1
            else:
                row.append(text)
        rows.append(row)
    best = {i: n for i, n in best_count.items() if n}
    if rows and len(impls) > 2 * len(rows):
        return _on_its_side(impls, rows, cpu, primary, best, next(iter(by_key.values())))
    return {"columns": ["shape", "dtype", *(f"`{i}`" for i in impls)], "rows": rows,
            "align": list("ll" + ("c" if cpu else "r") * len(impls)), "best": best,
            "sideways": False}


def _on_its_side(impls: list[str], rows: list[list[str]], cpu: bool, primary: str,
                 best: dict, first_shape: dict[str, dict]) -> dict:
    """Implementations as rows: the baseline, then by the first shape's primary metric."""
    def rank(k: int) -> tuple:
        v = None if k == 0 or cpu else _cell(first_shape.get(impls[k]), cpu, primary)[1]
        return (k > 0, -v if v is not None else 0.0, k)

    order = sorted(range(len(impls)), key=rank)
    return {"columns": ["implementation", *(f"{r[0]} · {r[1]}" for r in rows)],
            "rows": [[f"`{impls[k]}`", *(row[2 + k] for row in rows)] for k in order],
            "align": list("l" + ("c" if cpu else "r") * len(rows)), "best": best,
            "sideways": True}
