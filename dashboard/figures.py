"""Figures only the dashboard draws: compare ratios, history, kernel timelines (plotly).

The figures shared with reports (speedup vs shape, roofline, stalls, occupancy) live in
`harness.present.charts`; these take the frames built by `dashboard.data`. The Run page draws
the report's speedup bars (`charts.speedup_bars`) as a server-drawn SVG
(`dashboard.speedup_svg`), which needs no charting library in the browser.
"""
from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.compare_data import MARK_COLORS
from dashboard.data import HISTORY_METRICS

LAYOUT = dict(template="plotly_white", margin=dict(l=10, r=10, t=50, b=10),
              legend=dict(orientation="h", yanchor="top", y=-0.12, x=0))


def ratio_chart(time: pd.DataFrame) -> go.Figure:
    """The time ratio per case with its confidence interval, coloured by mark.

    ratio = base / candidate (> 1: the candidate run is faster), as `compare_runs` gives it."""
    t = time.dropna(subset=["ratio"]).copy()
    t["label"] = t.key.astype(str)
    fig = go.Figure()
    for mark, g in t.groupby("mark", sort=False):
        fig.add_trace(go.Scatter(
            x=g.ratio, y=g.label, mode="markers", name=str(mark),
            marker=dict(color=MARK_COLORS.get(mark, "#57606a"), size=9),
            error_x=dict(type="data", symmetric=False, array=(g.ci_high - g.ratio).tolist(),
                         arrayminus=(g.ratio - g.ci_low).tolist(), thickness=1.2),
            customdata=g[["base_ms", "cand_ms", "p_value", "text"]].to_numpy(),
            hovertemplate="%{y}<br>ratio %{x:.3f}<br>base %{customdata[0]:.4f} ms · cand "
                          "%{customdata[1]:.4f} ms<br>p = %{customdata[2]:.3g}<br>"
                          "%{customdata[3]}<extra></extra>"))
    fig.add_vline(x=1.0, line_dash="dot", line_color="#888")
    fig.update_layout(**LAYOUT, height=max(320, 22 * len(t) + 120),
                      title="time ratio baseline / candidate (> 1: candidate faster), 95% CI",
                      xaxis_title="baseline median / candidate median",
                      yaxis=dict(autorange="reversed"))
    return fig


def history_chart(hist: pd.DataFrame, shape: str, impls: list[str], metric: str) -> go.Figure:
    """One line per impl over the runs (git sha · date on the x-axis) for one case."""
    h = hist[(hist["shape"] == shape) & hist.impl.isin(impls)]
    order = list(dict.fromkeys(hist.x))  # runs oldest first
    fig = go.Figure()
    for impl, g in h.groupby("impl", sort=False):
        g = g.set_index("x").reindex([x for x in order if x in set(g.x)]).reset_index()
        err = {}
        if metric == "median_ms" and {"p20_ms", "p80_ms"} <= set(g.columns):
            err = dict(error_y=dict(type="data", symmetric=False,
                                    array=(g.p80_ms - g.median_ms).tolist(),
                                    arrayminus=(g.median_ms - g.p20_ms).tolist(),
                                    thickness=1))
        fig.add_trace(go.Scatter(
            x=g.x, y=g[metric] if metric in g else None, mode="lines+markers", name=impl,
            customdata=g[["run_id", "gpu", "status", "correct"]].astype(str).to_numpy(),
            hovertemplate=f"{impl}<br>%{{x}}<br>{HISTORY_METRICS.get(metric, metric)} "
                          "%{y:.4g}<br>run %{customdata[0]} on %{customdata[1]}<br>"
                          "status %{customdata[2]}, correct %{customdata[3]}<extra></extra>",
            **err))
    fig.update_layout(**LAYOUT, height=420, title=f"{shape}: {HISTORY_METRICS.get(metric, metric)}"
                      " per run", xaxis=dict(title="git sha · date · run", type="category",
                                             categoryorder="array", categoryarray=order),
                      yaxis_title=HISTORY_METRICS.get(metric, metric))
    return fig


def kernels_overview(kernels: pd.DataFrame) -> go.Figure:
    """Per case, a stacked bar of the GPU time of each kernel in its NVTX range."""
    fig = go.Figure()
    if "kernel_time_us" not in kernels:
        return fig
    cases = list(dict.fromkeys(kernels.case_id))
    for name, g in kernels.groupby("short_name", sort=False):
        fig.add_trace(go.Bar(
            y=g.case_id, x=g.kernel_time_us, name=name, orientation="h",
            customdata=g[["kernel", "kernel_launches"]].to_numpy()
            if "kernel_launches" in g else g[["kernel", "kernel"]].to_numpy(),
            hovertemplate="%{y}<br>%{x:.2f} us · %{customdata[1]} launch(es)<br>"
                          "%{customdata[0]}<extra></extra>"))
    fig.update_layout(**LAYOUT, barmode="stack", height=max(320, 20 * len(cases) + 200),
                      title="GPU time per case, by kernel", xaxis_title="kernel time (us)",
                      yaxis=dict(categoryorder="array", categoryarray=cases[::-1]))
    return fig


def case_kernels(kernels: pd.DataFrame, case_id: str, event_us: float | None) -> go.Figure:
    """The kernels of one case, in launch-table order, against the CUDA-event median."""
    k = kernels[kernels.case_id == case_id]
    fig = go.Figure(go.Bar(x=k.get("kernel_time_us"), y=k.short_name, orientation="h",
                           text=k.get("kernel_launches"), texttemplate="%{text:.0f}×",
                           customdata=k.kernel, name="kernel time",
                           hovertemplate="%{y}: %{x:.2f} us<br>%{customdata}<extra></extra>"))
    if event_us:
        fig.add_vline(x=event_us, line_dash="dot", line_color="#cf222e",
                      annotation_text=f"CUDA-event median {event_us:.1f} us")
    fig.update_layout(**LAYOUT, height=max(240, 40 * len(k) + 140), title=case_id,
                      xaxis_title="kernel time (us)", yaxis=dict(autorange="reversed"))
    return fig
