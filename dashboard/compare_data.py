"""The Compare page's logic: `compare_runs` cached per run pair, its time table with marks,
and the profiler metrics that moved (dashboard.data keeps the run loaders and the other views).
"""
from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from dashboard.data import stamp
from harness import store
from harness.errors import HarnessError


@st.cache_data(show_spinner=False, max_entries=16)
def _cached_compare(base: str, cand: str, stamps: tuple, allow: bool) -> dict:
    from harness.analysis.compare import compare_runs, env_problems

    env = [(store.load_manifest(p).get("env") or {}) for p in (base, cand)]
    incomparable = env_problems(*env)
    try:
        c = compare_runs(base, cand, allow_incomparable=allow)
    except HarnessError as exc:
        return {"refused": str(exc), "incomparable": incomparable}
    return {"refused": None, "incomparable": incomparable, "base_run": c.base_run,
            "cand_run": c.cand_run, "problems": list(c.problems), "time": c.time,
            "metrics": c.metrics, "headline": c.headline, "notes": list(c.notes)}


def compare(base: str, cand: str, allow_incomparable: bool) -> dict:
    """`compare_runs` as a dict. `refused` holds the message when it refuses (envs differ, no
    common case); `incomparable` lists the env differences (what "compare anyway" overrides)."""
    return _cached_compare(base, cand, (stamp(base), stamp(cand)), allow_incomparable)


MARKS = {"faster": "▲ faster", "slower": "▼ slower", "same": "= same",
         "ambiguous": "~ ambiguous", "missing": "x missing", "unjudged": "· CPU: not judged"}
MARK_COLORS = {"faster": "#1a7f37", "slower": "#cf222e", "same": "#57606a",
               "ambiguous": "#9a6700", "missing": "#8250df", "unjudged": "#57606a"}


def time_table(time: pd.DataFrame) -> pd.DataFrame:
    out = time.copy()
    out["mark"] = out["mark"].map(lambda m: MARKS.get(m, m))
    cols = ["mark", "key", "base_ms", "cand_ms", "ratio", "ci_low", "ci_high", "p_value", "mde",
            "method", "text", "base_n", "cand_n", "base_correct", "cand_correct"]
    return out[[c for c in cols if c in out]].round(4)


def moved_metrics(metrics: pd.DataFrame, min_rel: float) -> pd.DataFrame:
    """The metrics `compare_runs` found moved, narrowed to |relative change| >= `min_rel`
    (rows without a numeric change, like a new top stall, are kept), biggest first."""
    if not len(metrics):
        return metrics
    rel = pd.to_numeric(metrics.rel_delta, errors="coerce").abs()
    keep = rel.isna() | (rel >= min_rel)
    out = metrics[keep].assign(_r=rel[keep].fillna(math.inf))
    out = out.sort_values("_r", ascending=False).drop(columns="_r")
    for c in ("base", "cand", "delta"):  # mixed numbers and stall names
        out[c] = out[c].map(_metric_text)
    out["rel_delta"] = pd.to_numeric(out.rel_delta, errors="coerce").map(
        lambda v: "-" if pd.isna(v) else f"{v * 100:+.1f}%")
    return out


def _metric_text(v) -> str:
    """A moved metric's value as the terminal prints it: 4 significant digits, `-` if none."""
    from dashboard.tables import MISSING, sig

    if v is None or (isinstance(v, float) and math.isnan(v)):
        return MISSING
    return sig(float(v), 4) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


