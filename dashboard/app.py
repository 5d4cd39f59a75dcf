"""kernel-lab dashboard: the router. `python -m harness dashboard` or
`streamlit run dashboard/app.py -- --store runs`.

The sidebar holds the run selection (a run, and optionally a second run to compare with); it is
rendered on every page, so the choice persists across pages and is mirrored in the URL
(?run=<run_id>&base=<run_id>).
"""
from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:  # `streamlit run dashboard/app.py` puts dashboard/ on the path, not /
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from dashboard import data, runs_table  # noqa: E402

st.set_page_config(page_title="kernel-lab", page_icon=":material/bolt:", layout="wide")

roots = data.store_roots(sys.argv[1:])
st.session_state["roots"] = roots
runs = runs_table.runs_frame(roots)
st.session_state["runs"] = runs

options = runs.path.tolist()
labels = runs_table.run_labels(runs)
qp = st.query_params
if st.session_state.get("run_a") not in options:
    st.session_state["run_a"] = runs_table.default_run(runs, qp.get("run"))
if st.session_state.get("run_b") not in [data.NONE, *options]:
    st.session_state["run_b"] = runs_table.find_run(runs, qp.get("base"))

with st.sidebar:
    st.markdown("### :material/bolt: kernel-lab")
    if options:
        st.selectbox("Run", options, key="run_a", format_func=lambda p: labels.get(p, p),
                     help="the run shown on the Run, Roofline, Stalls and Timeline pages; "
                          "the candidate on the Compare page")
        st.selectbox("Compare with (baseline run)", [data.NONE, *options], key="run_b",
                     format_func=lambda p: labels.get(p, p))
    st.caption("stores: " + ", ".join(
        f"`{r.path}`" + (" (examples)" if r.example else "") for r in roots))

if st.session_state["run_a"]:
    qp["run"] = Path(st.session_state["run_a"]).name
if st.session_state["run_b"]:
    qp["base"] = Path(st.session_state["run_b"]).name
elif "base" in qp:
    del qp["base"]

PAGES = [  # (file, title, material icon); the first is the default page at /
    ("views/runs.py", "Runs", "table_rows"),
    ("views/run.py", "Run", "summarize"),
    ("views/roofline.py", "Roofline", "show_chart"),
    ("views/stalls.py", "Stalls & occupancy", "traffic"),
    ("views/source.py", "Source lines", "code"),
    ("views/compare.py", "Compare", "compare_arrows"),
    ("views/history.py", "History", "history"),
    ("views/timeline.py", "Timeline", "timer"),
]
page = st.navigation([
    st.Page(path, title=title, icon=f":material/{icon}:", default=i == 0,
            url_path=None if i == 0 else Path(path).stem)
    for i, (path, title, icon) in enumerate(PAGES)])
page.run()
