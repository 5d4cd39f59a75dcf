"""Streamlit's own command line, with the dashboard's first work done while a browser loads it.

`python -m harness dashboard` starts `python dashboard/serve.py run dashboard/app.py ...` in
place of `python -m streamlit run ...`: the same server, plus a thread that, as soon as the
server's runtime exists, imports the pages' modules (pandas/pyarrow, dashboard.*,
harness.present.charts), reads the runs table into the runtime's caches and builds plotly's template
and trace types. A browser spends its first second or two loading the app's scripts; the
first page then finds that work done, or in progress (a second caller of a cached loader waits
for the first). `streamlit run dashboard/app.py` still works, with a slower first page.
"""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:  # run as a script: the repository root holds harness/ and dashboard/
    sys.path.insert(0, _ROOT)


def warm(app_args: list[str], wait_s: float = 60) -> None:
    """Once the runtime exists (so that st.cache_data fills the server's caches): import the
    pages' modules, read the runs table (`app_args`: the app's own arguments), then prepare
    plotly for the first chart."""
    from streamlit import runtime

    deadline = time.monotonic() + wait_s
    while not runtime.exists():
        if time.monotonic() > deadline:
            return
        time.sleep(0.02)
    import pyarrow.dataset  # noqa: F401  (pandas.read_parquet imports it on its first call)

    from dashboard import (compare_data, data, figures, runs_table,  # noqa: F401
                           source_data, speedup_svg, tables)
    from harness.present import charts
    from harness.analysis import since, summary  # noqa: F401  # noqa: F401

    runs_table.runs_frame(data.store_roots(app_args))
    warm_plotly(charts.LAYOUT)


def warm_plotly(layout: dict) -> None:
    """Build plotly's template and one small figure with the trace and layout properties the
    pages' plotly charts (Roofline, Stalls, Compare, History, Timeline) set: plotly reads the
    template and imports a module per property group on first use (~150 of them for a bar
    chart like the report's speedup chart), and a figure of pandas data loads narwhals."""
    import pandas as pd
    import plotly.graph_objects as go
    import plotly.io as pio

    pio.templates[layout["template"]]
    x, y = pd.Series(["a", "b"]), pd.Series([1.0, 2.0])
    fig = go.Figure([
        go.Bar(x=x, y=y, name="a", marker_color="#1f77b4", marker_pattern_shape=["", "/"],
               text=["1x", "2x"], textposition="outside", textfont=dict(size=9),
               cliponaxis=False, customdata=[["1", ""], ["2", ""]], hovertemplate="%{x}"),
        go.Scatter(x=y, y=y, mode="lines+markers+text", name="b", text=["a", "b"],
                   marker=dict(size=8, symbol="circle", line=dict(width=1)),
                   line=dict(dash="dash", color="#555"), hovertext=["a", "b"],
                   hoverinfo="text", showlegend=False)])
    fig.add_hline(y=1.0, line_dash="dash", line_color="#555", annotation_text="1x",
                  annotation_position="top left")
    fig.add_annotation(text="a", showarrow=False, xref="paper", yref="paper", x=1, y=1,
                       font=dict(size=10, color="#555"))
    fig.update_layout(title="a", barmode="group", xaxis_title="x", yaxis_title="y", **layout)
    fig.update_xaxes(type="log", categoryorder="array", categoryarray=["a", "b"])
    fig.update_yaxes(type="log", rangemode="tozero")
    pio.to_json(go.Figure(fig.to_dict()), validate=False)  # what st.plotly_chart does


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from streamlit.web import cli

    app_args = argv[argv.index("--") + 1:] if "--" in argv else []
    threading.Thread(target=warm, args=(app_args,), name="dashboard-warm", daemon=True).start()
    return cli.main(args=argv, prog_name="streamlit")


if __name__ == "__main__":
    sys.exit(main())
