"""Streamlit's own command line, run after importing what the dashboard's pages need.

`python -m harness dashboard` starts `python dashboard/serve.py run dashboard/app.py ...` in
place of `python -m streamlit run ...`: the same server, except that pandas/pyarrow, the
dashboard's modules, harness.charts and plotly's figure template are loaded while the server
starts, not by the first page a browser opens (they were a second or more of its time on a
2-core machine). `streamlit run dashboard/app.py` still works, with a slower first page.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:  # run as a script: the repository root holds harness/ and dashboard/
    sys.path.insert(0, _ROOT)


def preload() -> None:
    """Import the modules every page imports, and build the plotly template and trace types
    the charts use (plotly reads, imports and validates them on first use)."""
    import plotly.io as pio
    import pyarrow.dataset  # noqa: F401  (pandas.read_parquet imports it on its first call)
    import pyarrow.parquet  # noqa: F401
    import streamlit  # noqa: F401  (its loggers take their levels when made)

    # st.cache_data checks its arguments when it decorates, and before the server exists says
    # so ("No runtime found"); the caches themselves are made on first call, in the server
    quiet = logging.getLogger("streamlit.runtime.caching.cache_data_api")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        from dashboard import compare_data, data, figures, source_data, tables  # noqa: F401
        from harness import charts
        from harness.analysis import since, summary  # noqa: F401
    finally:
        quiet.setLevel(level)
    pio.templates[charts.LAYOUT["template"]]
    _warm_plotly(charts.LAYOUT)


def _warm_plotly(layout: dict) -> None:
    """One small figure with the trace and layout properties the pages' charts set: plotly
    imports a module per property group on first use (~150 of them for the Run page's chart),
    and a figure of pandas data loads narwhals."""
    import pandas as pd
    import plotly.graph_objects as go
    import plotly.io as pio

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
    pio.to_json(go.Figure(fig.to_dict()), validate=False)


def warm_runs_table(app_args: list[str], wait_s: float = 60) -> None:
    """Fill the runs table's caches once the server's runtime exists (its caches are the
    runtime's): the first page, whose browser is still loading the app, then finds the table
    ready, or being read (a second caller waits for the first)."""
    from streamlit import runtime

    deadline = time.monotonic() + wait_s
    while not runtime.exists():
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)
    from dashboard import data

    data.runs_frame(data.store_roots(app_args))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    preload()
    from streamlit.web import cli

    app_args = argv[argv.index("--") + 1:] if "--" in argv else []
    threading.Thread(target=warm_runs_table, args=(app_args,), name="warm-runs-table",
                     daemon=True).start()
    return cli.main(args=argv, prog_name="streamlit")


if __name__ == "__main__":
    sys.exit(main())
