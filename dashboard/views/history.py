"""History: one case across runs (git sha and date on the x-axis): the loop over time."""
import streamlit as st

from dashboard import data, figures, tables

st.title("History")
runs, roots = st.session_state["runs"], st.session_state["roots"]
ops = sorted(set(runs[runs.problem == ""].op) - {""})
if not ops:
    st.info("No readable runs in the stores yet.")
    st.stop()
current = runs[runs.path == st.session_state.get("run_a")]
c1, c2, c3, c4 = st.columns([1, 1, 2, 1])
op = c1.selectbox("Op", ops, key="history_op",
                  index=ops.index(current.op.iloc[0]) if len(current) and current.op.iloc[0]
                  in ops else 0)
gpus = sorted(set(runs[(runs.op == op) & (runs.problem == "")].gpu))
gpu = c2.selectbox("Device", gpus, key="history_gpu",
                   index=gpus.index(current.gpu.iloc[0]) if len(current) and current.gpu.iloc[0]
                   in gpus else 0, help="timings are only comparable on one device")
hist = data.history_frame(runs, roots, op, gpu)
shapes = list(dict.fromkeys(hist["shape"]))
shape = c3.selectbox("Case", shapes, key="history_case")
metric = c4.selectbox("Metric", list(data.HISTORY_METRICS), key="history_metric",
                      format_func=data.HISTORY_METRICS.get)
all_impls = sorted(set(hist[hist["shape"] == shape].impl))
impls = st.multiselect("Implementations", all_impls, default=all_impls)
n_runs = hist.run_id.nunique()
if n_runs < 2:
    st.info(f"{n_runs} run of {op} on {gpu} so far: each new run adds a point to every line.")
st.plotly_chart(figures.history_chart(hist, shape, impls, metric), key="history")
sel = hist[(hist["shape"] == shape) & hist.impl.isin(impls)]
tables.show(sel[[c for c in ["x", "impl", "source", "gpu", "status", "correct", metric]
                 if c in sel]].round(4), hide_index=True, width="stretch")
