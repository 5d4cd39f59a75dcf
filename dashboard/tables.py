"""The dashboard's tables as people read them: numbers like the terminal's (significant digits,
units in the format), `-` where a value is missing, never `None` or `nan`.

A numeric column without missing values stays numeric (it sorts as numbers) and gets a
`NumberColumn` format; its values are rounded to what the format shows. A numeric column with
missing values becomes text, formatted the same way with `-` for the gaps (Streamlit draws a
missing number as "None", whatever the format), right-aligned. Text columns get `-` for missing
values; true/false/missing columns read ✓ / ✗ / -.

How a column is formatted comes from its name (KINDS_BY_NAME, shared by every page); a float
column with an unknown name gets four significant digits.
"""
from __future__ import annotations

import math
from typing import Callable

import pandas as pd
import streamlit as st

from harness.present.show import fmt_bytes

MISSING = "-"


def sig(v: float, n: int) -> str:
    """n significant digits, no exponent, trailing zeros dropped: 1189, 27.94, 0.006812."""
    if v == 0 or not math.isfinite(v):
        return "0" if v == 0 else str(v)
    decimals = max(0, n - 1 - math.floor(math.log10(abs(v))))
    s = f"{v:.{decimals}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


def round_sig(v: float, n: int) -> float:
    if v == 0 or not math.isfinite(v):
        return v
    return round(v, max(0, n - 1 - math.floor(math.log10(abs(v)))))


# kind -> (NumberColumn format, Python formatter for text columns, rounding of the data)
Kind = tuple[str | None, Callable[[float], str], Callable[[float], float]]
KINDS: dict[str, Kind] = {
    "sig4": ("%.4g", lambda v: sig(v, 4), lambda v: round_sig(v, 4)),
    "sig2": ("%.2g", lambda v: sig(v, 2), lambda v: round_sig(v, 2)),
    "x": ("%.2fx", lambda v: f"{v:.2f}x", lambda v: round(v, 2)),
    "pct0": ("%.0f%%", lambda v: f"{v:.0f}%", lambda v: round(v, 0)),
    "pct1": ("%.1f%%", lambda v: f"{v:.1f}%", lambda v: round(v, 1)),
    "f0": ("%,.0f", lambda v: f"{v:,.0f}", lambda v: round(v, 0)),
    "f1": ("%,.1f", lambda v: f"{v:,.1f}", lambda v: round(v, 1)),
    "f2": ("%.2f", lambda v: f"{v:.2f}", lambda v: round(v, 2)),
    "int": ("%d", lambda v: f"{v:.0f}", lambda v: round(v, 0)),
    "bytes": (None, fmt_bytes, lambda v: v),  # always text: the unit changes with the size
}

KINDS_BY_NAME = {
    # Run: summary
    "median ms": "sig4", "spread %": "pct1", "speedup": "x", "GB/s": "f0", "TFLOP/s": "f1",
    "% roof": "pct0", "DRAM %": "pct0", "occ %": "pct0", "kernels": "int",
    # Roofline points
    "intensity": "sig4", "pct_of_roof": "pct0",
    # Stalls & occupancy
    "achieved occupancy %": "pct0", "theoretical occupancy %": "pct0",
    "registers/thread": "int", "shared mem/block (B)": "bytes", "block size": "int",
    "grid size": "f0", "waves/SM": "f2",
    # Compare
    "base_ms": "sig4", "cand_ms": "sig4", "ratio": "x", "ci_low": "x", "ci_high": "x",
    "p_value": "sig2", "base_n": "int", "cand_n": "int",
    # History (raw column names)
    "median_ms": "sig4", "gbps": "f0", "tflops": "f1", "speedup_vs_baseline": "x",
    "sm_clock_timed_mhz": "f0",
    # Timeline (nsys / torch.profiler rows)
    "kernel_launches": "int", "kernel_time_us": "sig4", "kernel_count": "int",
    "gpu_time_us": "sig4", "api_time_us": "sig4", "range_wall_us": "sig4",
    # Source lines
    "share %": "f1", "samples": "int", "line": "int",
    # Runs
    "cases": "int", "ok": "int", "not ok": "int",
}


def _is_bool_like(s: pd.Series) -> bool:
    """An object column of true/false values, perhaps with gaps (a plain bool column is drawn
    as checkboxes and left alone)."""
    vals = s.dropna()
    return s.dtype == object and len(vals) > 0 and all(
        isinstance(v, bool) or type(v).__name__ == "bool_" for v in vals)


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA


def readable(df: pd.DataFrame, kinds: dict[str, str] | None = None
             ) -> tuple[pd.DataFrame, dict]:
    """(the frame to show, its column_config); `kinds` adds or overrides column -> kind."""
    by_name = {**KINDS_BY_NAME, **(kinds or {})}
    out, config = df.copy(), {}
    for col in df.columns:
        s = df[col]
        if pd.api.types.is_bool_dtype(s):
            continue
        if _is_bool_like(s):
            out[col] = s.map(lambda v: MISSING if _missing(v) else "✓" if v else "✗")
            continue
        if pd.api.types.is_numeric_dtype(s):
            kind = by_name.get(col) or ("int" if pd.api.types.is_integer_dtype(s) else "sig4")
            fmt, text, rnd = KINDS[kind]
            if fmt is not None and not s.isna().any():
                out[col] = s.map(rnd)
                config[col] = st.column_config.NumberColumn(format=fmt)
            else:
                out[col] = s.map(lambda v: MISSING if pd.isna(v) else text(float(v)))
                config[col] = st.column_config.TextColumn(alignment="right")
            continue
        if s.isna().any() or s.map(lambda v: isinstance(v, str) and v in ("None", "nan")).any():
            out[col] = s.map(lambda v: MISSING if _missing(v) or v in ("None", "nan") else v)
    return out, config


def show(df: pd.DataFrame, *, kinds: dict[str, str] | None = None,
         column_config: dict | None = None, **kwargs):
    """st.dataframe of `readable(df)`; an explicit column_config entry wins for its column."""
    shown, config = readable(df, kinds)
    return st.dataframe(shown, column_config={**config, **(column_config or {})}, **kwargs)
