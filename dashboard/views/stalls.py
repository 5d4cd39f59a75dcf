"""Stalls & occupancy: ncu's warp stall reasons and the occupancy of each profiled kernel."""
import streamlit as st

from dashboard import data, tables
from harness.present import charts

st.title("Stalls & occupancy")
rd = data.selected_run()
st.caption(rd.title)
if not data.has_ncu(rd):
    st.info("This run has no ncu metrics (a CPU run, or profile.ncu disabled in the experiment).")
    st.stop()
st.caption("Cycles per issued instruction a warp spent in each stall reason (dominant kernel of "
           "each profiled case); `selected` is issuing, not stalling.")
st.plotly_chart(charts.stall_bars(rd.metrics, rd.summary), key="stalls")
st.subheader("Occupancy")
tables.show(charts.occupancy_table(rd.summary), hide_index=True, width="stretch")
