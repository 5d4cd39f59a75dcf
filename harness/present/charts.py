"""Plotly figure builders shared by the report and the dashboard (no Streamlit here).

Each builder takes DataFrames from `harness.analysis.summary.summary_frame` (one row per case,
`params` as dicts) and/or `harness.store.load_metrics` (long format) and returns a Figure:

    speedup_vs_shape(summary_df)                 baseline median / case median per shape
    speedup_bars(summary_df)                     its bars as a frame (the dashboard draws them)
    roofline(summary_df, calibration, intensity) log-log; ceilings measured by `harness calibrate`
    roofline_toggle(summary_df, calibration)     both intensities, switched by buttons
    stall_bars(metrics_df, summary_df)           stall_* cycles per issued instruction, stacked
    occupancy_table(summary_df)                  a DataFrame (achieved vs theoretical, limiter...)

Only correct cases (status ok) are plotted as performance; plotly is imported by report,
compare and dashboard code only, never by the worker path.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from harness.profilers.metrics import STALL_REASONS
from harness.experiment.spec import DTYPE_SHORT
from harness.values import finite as _num

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b",
          "#e377c2", "#7f7f7f", "#bcbd22")
LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=60, b=60),
              font=dict(size=12), legend=dict(orientation="h", y=-0.2))



def shape_label(row) -> str:
    """`M=8192 N=8192 fp16` (params in sweep order, then the dtype)."""
    params = row["params"] if isinstance(row["params"], dict) else {}
    shape = " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                     for k, v in params.items())
    return f"{shape} {DTYPE_SHORT.get(row['dtype'], row['dtype'])}".strip()


def _impl_colors(df: pd.DataFrame) -> dict[str, str]:
    impls = list(dict.fromkeys(df["impl"]))
    return {impl: COLORS[i % len(COLORS)] for i, impl in enumerate(impls)}


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    if not len(df):
        return df
    ok = df["status"] == "ok"
    if "correct" in df.columns:  # missing (checks off) counts as ok; False does not
        ok &= df["correct"].map(lambda v: bool(pd.isna(v)) or bool(v))
    return df[ok]


def _empty(title: str, message: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, **LAYOUT)
    fig.add_annotation(text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


# bars labelled with their value up to this many: beyond it the labels overlap, and measuring
# them was most of the time a browser took to draw the chart (240 bars: ~1 s of 1.4 s)
MAX_LABELLED_BARS = 48


SPEEDUP_TITLE = "Speedup vs baseline per shape (baseline median / median; correct cases only)"


def speedup_bars(summary_df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """(the bars of `speedup_vs_shape`, the baseline's name): one row per correct, timed
    candidate case, in the summary's order, with shape (its label), impl, speedup, median_ms,
    significant (the speedup mark is faster or slower; None without marks), verdict (the mark's
    text, "" without marks) and color (one per impl of the whole run). Shared by the report's
    plotly figure and the dashboard's SVG chart (dashboard/speedup_svg.py)."""
    cols = ["shape", "impl", "speedup", "median_ms", "significant", "verdict", "color"]
    df = _ok(summary_df)
    if not len(df) or "speedup_vs_baseline" not in df:
        return pd.DataFrame(columns=cols), "baseline"
    base = df[df.role == "baseline"]
    base_name = base["impl"].iloc[0] if len(base) else "baseline"
    c = df[(df.role != "baseline") & df.speedup_vs_baseline.notna()]
    marks = "speedup_mark" in c.columns
    colors = _impl_colors(summary_df)
    bars = pd.DataFrame({
        "shape": c.apply(shape_label, axis=1) if len(c) else pd.Series(dtype=object),
        "impl": c["impl"], "speedup": c["speedup_vs_baseline"].astype(float),
        "median_ms": c["median_ms"].astype(float),
        "significant": [m in ("faster", "slower") for m in c["speedup_mark"]] if marks
        else None,
        "verdict": list(c["speedup_text"]) if "speedup_text" in c else "",
        "color": c["impl"].map(colors)}, columns=cols)
    return bars.reset_index(drop=True), base_name


def speedup_vs_shape(summary_df: pd.DataFrame) -> go.Figure:
    """Grouped bars: speedup_vs_baseline per shape, one colour per candidate; 1x line. Each bar
    is labelled with its speedup where there are at most MAX_LABELLED_BARS (the hover always
    gives it)."""
    df = _ok(summary_df)
    if not len(df) or "speedup_vs_baseline" not in df:
        return _empty(SPEEDUP_TITLE, "no timed correct cases")
    bars, base_name = speedup_bars(summary_df)
    fig = go.Figure()
    marks = "speedup_mark" in df.columns
    labelled = len(bars) <= MAX_LABELLED_BARS
    colors = _impl_colors(summary_df)
    for impl in dict.fromkeys(df[df.role != "baseline"].impl):  # a trace even if none timed
        g = bars[bars.impl == impl]
        fig.add_trace(go.Bar(
            x=g["shape"], y=g["speedup"], name=impl, marker_color=colors[impl],
            marker_pattern_shape=["" if s else "/" for s in g["significant"]]
            if marks and len(g) else None,
            text=[f"{v:.2f}x" for v in g.speedup] if labelled else None,
            textposition="outside" if labelled else None, textfont=dict(size=9),
            cliponaxis=False,
            customdata=np.stack([g["median_ms"].map("{:.4f}".format), g["verdict"]], axis=-1),
            hovertemplate=f"<b>{impl}</b> %{{x}}<br>speedup %{{y:.2f}}x<br>"
                          "median %{customdata[0]} ms<br>%{customdata[1]}<extra></extra>"))
    if marks:
        fig.add_annotation(text="hatched: not a significant difference (same or ambiguous)",
                           showarrow=False, xref="paper", yref="paper", x=1, y=1.06,
                           xanchor="right", font=dict(size=10, color="#555"))
    fig.add_hline(y=1.0, line_dash="dash", line_color="#555",
                  annotation_text=f"{base_name} (1x)", annotation_position="top left")
    fig.update_layout(title=SPEEDUP_TITLE, barmode="group", yaxis_title="speedup (x)",
                      xaxis_title="shape", **LAYOUT)
    return fig


def _points(df: pd.DataFrame, intensity: str) -> pd.DataFrame:
    """x = FLOP/byte, y = TFLOP/s per case, from the op's analytic counts or ncu's counters."""
    if intensity == "analytic":
        if not {"tflops", "gbps"} <= set(df.columns):
            return df.iloc[0:0].assign(x=[], y=[])
        x = df.apply(lambda r: (_num(r.tflops) or 0) * 1e3 / _num(r.gbps)
                     if _num(r.gbps) else None, axis=1)
        y = df["tflops"].map(_num)
    elif intensity == "counted":
        if not {"counted_intensity", "ncu_tflops"} <= set(df.columns):
            return df.iloc[0:0].assign(x=[], y=[])
        x = df["counted_intensity"].map(_num)
        y = df["ncu_tflops"].map(_num)
    else:
        raise ValueError(f"intensity must be 'analytic' or 'counted', got {intensity!r}")
    out = df.assign(x=x, y=y)
    return out[out.x.map(lambda v: v is not None and v > 0) &
               out.y.map(lambda v: v is not None and v > 0)]


def _hover(r) -> str:
    bits = [f"<b>{r['impl']}</b> {shape_label(r)}",
            f"median {_num(r.get('median_ms')) or math.nan:.4f} ms"]
    for col, fmt in (("gbps", "{:,.0f} GB/s"), ("tflops", "{:.2f} TFLOP/s (analytic)"),
                     ("pct_of_roof", "{:.0f}% of roof"),
                     ("achieved_occupancy_pct", "occupancy {:.0f}%"),
                     ("registers_per_thread", "{:.0f} registers"),
                     ("dram_throughput_pct", "DRAM {:.0f}%")):
        v = _num(r.get(col))
        if v is not None:
            bits.append(fmt.format(v))
    if isinstance(r.get("top_stall"), str):
        bits.append(f"top stall {r['top_stall']}")
    return "<br>".join(bits)


def _roof_traces(fig: go.Figure, calibration: dict, xs: list[float]) -> None:
    bw = float(calibration["copy_gbps"]) / 1e3  # TB/s = TFLOP/s per FLOP/byte
    roofs = [(f"{DTYPE_SHORT.get(k, k)} tensor {v:.0f} TFLOP/s", float(v))
             for k, v in sorted((calibration.get("matmul_tflops") or {}).items()) if v]
    if _num(calibration.get("fma_tflops_fp32")):
        roofs.append((f"fp32 FMA {float(calibration['fma_tflops_fp32']):.0f} TFLOP/s",
                      float(calibration["fma_tflops_fp32"])))
    peak = max((v for _, v in roofs), default=bw * 100)
    ridge = peak / bw
    lo = min(min(xs, default=ridge) / 10, ridge / 100)
    hi = max(max(xs, default=ridge) * 10, ridge * 10)
    grid = np.logspace(math.log10(lo), math.log10(hi), 200)
    slope = grid[grid <= ridge]
    fig.add_trace(go.Scatter(x=[*slope, ridge], y=[*(slope * bw), peak], mode="lines",
                             name=f"DRAM {bw * 1e3:,.0f} GB/s (measured copy)",
                             line=dict(color="#444", dash="dot"), hoverinfo="name"))
    for i, (name, v) in enumerate(roofs):
        fig.add_trace(go.Scatter(x=grid, y=np.minimum(grid * bw, v), mode="lines", name=name,
                                 line=dict(color="#888", width=1.5, dash=("solid", "dash",
                                                                          "dashdot")[i % 3]),
                                 hoverinfo="name"))


def roofline(summary_df: pd.DataFrame, calibration: dict | None,
             intensity: str = "analytic") -> go.Figure:
    """Log-log roofline: one point per impl x case; measured ceilings from `calibration`.

    intensity "analytic": FLOP/byte and TFLOP/s from the op's flops()/bytes() and the events
    median; "counted": ncu's counted FLOPs over DRAM bytes and over ncu's duration (profiled
    cases only). Without calibration only the points are drawn, with a note saying so.
    """
    df = _points(_ok(summary_df), intensity)
    title = f"Roofline ({intensity} intensity)"
    if not len(df):
        why = ("no case with ncu-counted FLOPs and DRAM bytes" if intensity == "counted"
               else "no correct case with FLOPs and bytes to place")
        fig = _empty(title, why)
    else:
        fig = go.Figure()
        colors = _impl_colors(summary_df)
        for impl, g in df.groupby("impl", sort=False):
            fig.add_trace(go.Scatter(
                x=g["x"], y=g["y"], mode="markers", name=f"{impl}",
                marker=dict(size=10, color=colors[impl], line=dict(width=1, color="white")),
                text=[_hover(r) for r in g.to_dict("records")],
                hovertemplate="%{text}<br>%{x:.3g} FLOP/byte, %{y:.3g} TFLOP/s<extra></extra>"))
        if calibration and _num(calibration.get("copy_gbps")):
            _roof_traces(fig, calibration, list(df["x"]))
            src = calibration.get("gpu_name") or "calibration"
            fig.update_layout(title=f"{title} - ceilings measured on {src}")
        else:
            fig.add_annotation(text="no calibration for this GPU: run `python -m harness "
                               "calibrate` to draw the measured roofs", showarrow=False,
                               xref="paper", yref="paper", x=0.5, y=1.05)
        fig.update_xaxes(type="log", title="arithmetic intensity (FLOP/byte)")
        fig.update_yaxes(type="log", title="TFLOP/s")
        fig.update_layout(**LAYOUT)
        if not fig.layout.title.text:
            fig.update_layout(title=title)
    return fig


def roofline_toggle(summary_df: pd.DataFrame, calibration: dict | None) -> go.Figure:
    """The analytic roofline, plus the counted points behind an 'analytic | counted' switch
    when ncu counted FLOPs and bytes for some case."""
    fig = roofline(summary_df, calibration, "analytic")
    counted = _points(_ok(summary_df), "counted")
    if not len(counted):
        return fig
    n_before = len(fig.data)
    extra = roofline(summary_df, None, "counted")
    for tr in extra.data:
        tr.name = f"{tr.name} (counted)"
        tr.marker.symbol = "diamond"
        tr.visible = False
        fig.add_trace(tr)
    roof = [bool(t.mode == "lines") for t in fig.data]
    analytic = [i < n_before or roof[i] for i in range(len(fig.data))]
    count_vis = [i >= n_before or roof[i] for i in range(len(fig.data))]
    title = fig.layout.title.text or ""
    fig.update_layout(updatemenus=[dict(
        type="buttons", direction="right", x=1.0, xanchor="right", y=1.0, yanchor="bottom",
        buttons=[dict(label="analytic intensity", method="update",
                      args=[{"visible": analytic}, {"title.text": title}]),
                 dict(label="ncu-counted intensity", method="update",
                      args=[{"visible": count_vis},
                            {"title.text": title.replace("analytic", "ncu-counted")}])])])
    return fig


def stall_bars(metrics_df: pd.DataFrame, summary_df: pd.DataFrame) -> go.Figure:
    """Stacked bars of the dominant kernel's stall_* (cycles per issued instruction) per
    profiled case; 'selected' (the issuing state) is left out."""
    title = "Warp stall reasons of the dominant kernel (cycles per issued instruction)"
    m = metrics_df[(metrics_df["source"] == "ncu") & metrics_df["name"].str.startswith("stall_")
                   & (metrics_df["name"] != "stall_selected")] if len(metrics_df) else metrics_df
    if not len(m) or "dominant_kernel" not in summary_df:
        return _empty(title, "no ncu-profiled case in this run")
    cases = summary_df[summary_df["dominant_kernel"].notna()]
    labels, per_case = [], []
    for r in cases.to_dict("records"):
        g = m[(m.case_id == r["case_id"]) & (m.kernel == r["dominant_kernel"])]
        if not len(g):
            continue
        labels.append(f"{r['impl']}<br>{shape_label(r)}")
        per_case.append(dict(zip(g["name"].str.removeprefix("stall_"), g["value"].astype(float))))
    if not labels:
        return _empty(title, "no ncu-profiled case in this run")
    totals = {s: sum(c.get(s, 0.0) for c in per_case) for s in STALL_REASONS}
    reasons = [s for s in sorted(totals, key=totals.get, reverse=True)
               if s != "selected" and totals[s] > 0]
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
               "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39",
               "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1")
    fig = go.Figure()
    for i, s in enumerate(reasons):
        fig.add_trace(go.Bar(x=labels, y=[c.get(s, 0.0) for c in per_case], name=s,
                             marker_color=palette[i % len(palette)],
                             hovertemplate=f"{s}: %{{y:.2f}} cycles/inst<extra>%{{x}}</extra>"))
    fig.update_layout(title=title, barmode="stack", yaxis_title="cycles per issued instruction",
                      **LAYOUT)
    return fig


OCCUPANCY_COLUMNS = {
    "achieved_occupancy_pct": "achieved occupancy %",
    "theoretical_occupancy_pct": "theoretical occupancy %",
    "occupancy_limiter": "limiter",
    "registers_per_thread": "registers/thread",
    "shared_mem_per_block_bytes": "shared mem/block (B)",
    "block_size": "block size",
    "grid_size": "grid size",
    "waves_per_sm": "waves/SM",
}


def occupancy_table(summary_df: pd.DataFrame) -> pd.DataFrame:
    """One row per ncu-profiled case: impl, case, then OCCUPANCY_COLUMNS' labels (numbers,
    the limiter as text; NaN where ncu gave nothing)."""
    cols = ["impl", "case", *OCCUPANCY_COLUMNS.values()]
    if "achieved_occupancy_pct" not in summary_df:
        return pd.DataFrame(columns=cols)
    df = summary_df[summary_df["achieved_occupancy_pct"].notna()]
    out = pd.DataFrame({"impl": df["impl"], "case": df.apply(shape_label, axis=1)
                        if len(df) else []})
    for src, label in OCCUPANCY_COLUMNS.items():
        out[label] = df[src] if src in df else None
    return out.reset_index(drop=True)[cols]
