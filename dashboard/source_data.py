"""The Source page's logic: a run's sampled source lines (ncu SourceCounters), the kernel's
file as a listing around them, and its per-line heat (dashboard.data keeps the run loaders).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard.data import stamp
from harness import store


@st.cache_data(show_spinner=False, max_entries=16)
def _cached_source_lines(path: str, stamp: str) -> pd.DataFrame:
    return store.load_source_lines(path)


def source_lines(path: str) -> pd.DataFrame:
    return _cached_source_lines(str(path), stamp(path))


def source_kernels(lines: pd.DataFrame) -> list[tuple[str, str]]:
    """(case_id, kernel) pairs with sampled lines, in stored order."""
    return list(dict.fromkeys(zip(lines.case_id, lines.kernel)))


def source_files(lines: pd.DataFrame, case_id: str, kernel: str) -> list[str]:
    """The kernel's files, most sampled first (the kernel's own file before Triton's library)."""
    g = lines[(lines.case_id == case_id) & (lines.kernel == kernel)]
    return list(g.groupby("file", sort=False).samples.sum().sort_values(ascending=False).index)


def _read_source(path: str) -> list[str] | None:
    try:
        return Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return None


def _stale(src: list[str], by_line: dict[int, dict]) -> bool:
    """The file on disk no longer holds the profiled code: a sampled line's stored text differs."""
    return any(str(r.get("text") or "").strip() and
               src[n - 1].strip() != str(r["text"]).strip() for n, r in by_line.items())


def source_listing(lines: pd.DataFrame, case_id: str, kernel: str, file: str,
                   context: int = 3) -> pd.DataFrame:
    """The file's lines around the sampled ones: line, share %, samples, top stalls, source.
    With the file on disk the listing is contiguous (sampled range ± context); without it, or
    when it changed since the capture, only the sampled lines (their text is stored with them)."""
    from harness.profilers.ncu_source import mix_text

    g = lines[(lines.case_id == case_id) & (lines.kernel == kernel) & (lines.file == file)]
    by_line = {int(r["line"]): r for r in g.to_dict("records")}
    src = _read_source(file)
    if src and by_line and max(by_line) <= len(src) and not _stale(src, by_line):
        numbers = range(max(1, min(by_line) - context), min(len(src), max(by_line) + context) + 1)
    else:
        numbers, src = sorted(by_line), None
    rows = []
    for n in numbers:
        r = by_line.get(n)
        text = str(r["text"]) if r is not None and not src else (src[n - 1] if src else "")
        rows.append({"line": n, "share %": round(r["share"] * 100, 2) if r is not None else None,
                     "samples": int(r["samples"]) if r is not None else None,
                     "top stalls": mix_text(r["stall_mix"], r["samples"], 3) if r is not None
                     else "", "source": text.rstrip()})
    return pd.DataFrame(rows, columns=["line", "share %", "samples", "top stalls", "source"])


def heat_style(listing: pd.DataFrame, scale: float | None = None):
    """The listing with each sampled row's background as hot as its share (max = full); share
    and samples as text, blank on lines without samples (Streamlit would print "None")."""
    share = pd.to_numeric(listing["share %"], errors="coerce")
    top = scale or (share.max() if share.notna().any() else 0) or 1.0
    shown = listing.assign(
        **{"share %": share.map(lambda v: "" if pd.isna(v) else f"{v:.1f}"),
           "samples": listing["samples"].map(lambda v: "" if pd.isna(v) else f"{v:.0f}")})

    def row_style(row):
        s = share.loc[row.name]
        if pd.isna(s) or s <= 0:
            return [""] * len(row)
        return [f"background-color: rgba(230, 80, 0, {0.08 + 0.72 * min(1.0, s / top):.2f})"] \
            * len(row)

    return shown.style.apply(row_style, axis=1)


def hot_lines_table(lines: pd.DataFrame, case_id: str, kernel: str, n: int = 10) -> pd.DataFrame:
    from harness.profilers.ncu_source import mix_text

    g = lines[(lines.case_id == case_id) & (lines.kernel == kernel)].nlargest(n, "samples")
    return pd.DataFrame({
        "where": [f"{Path(f).name}:{int(l)}" for f, l in zip(g.file, g.line)],
        "share %": (g.share * 100).round(1).to_list(),
        "top stalls": [mix_text(m, s, 3) for m, s in zip(g.stall_mix, g.samples)],
        "triton lib": g.library.astype(bool).to_list(),
        "source": g.text.str.strip().to_list()})
