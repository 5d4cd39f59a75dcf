"""Timeline: per case, the kernels nsys (or torch.profiler) saw in its NVTX range."""
import streamlit as st

from dashboard import data, figures, tables

st.title("Timeline")
rd = data.selected_run()
st.caption(rd.title)
source, kernels, totals = data.kernel_rows(rd.metrics, list(rd.summary.case_id))
if source is None:
    st.info("This run has no nsys or torch.profiler rows (a CPU run, or profile.nsys disabled).")
    st.stop()
st.caption(f"kernels as seen by **{source}**, one measured call per case")
st.plotly_chart(figures.kernels_overview(kernels), key="kernels_overview")

case_ids = list(dict.fromkeys(kernels.case_id))
case = st.selectbox("Case", case_ids, key="timeline_case")
row = rd.summary[rd.summary.case_id == case]
event_us = float(row.median_ms.iloc[0]) * 1e3 if len(row) and row.median_ms.notna().iloc[0] \
    else None
tot = totals.loc[case] if case in totals.index else {}
cols = st.columns(5)
for col, (k, label) in zip(cols, [("kernel_count", "kernels"), ("gpu_time_us", "GPU time us"),
                                  ("api_time_us", "API time us"),
                                  ("range_wall_us", "range wall us")]):
    v = tot.get(k) if len(tot) else None
    col.metric(label, "-" if v is None else f"{v:,.2f}".rstrip("0").rstrip("."))
cols[4].metric("event median us", "-" if event_us is None else f"{event_us:,.2f}")
st.plotly_chart(figures.case_kernels(kernels, case, event_us), key="case_kernels")
tables.show(kernels[kernels.case_id == case].drop(columns="case_id"), hide_index=True,
            width="stretch")
