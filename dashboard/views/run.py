"""Run: the summary table, speedup vs shape, correctness and validity flags."""
import streamlit as st

from dashboard import data, tables
from harness import charts

st.title("Run")
rd = data.selected_run()
st.caption(rd.title)
st.markdown(" · ".join(f"**{k}** {v}" for k, v in data.run_facts(rd).items()))
if rd.is_cpu:
    st.warning("CPU run: Triton kernels ran in the interpreter; times are CPU wall-clock, useful "
               "for checking correctness, not for performance.")

st.subheader("Summary")
tables.show(data.summary_table(rd.summary, rd.is_cpu), hide_index=True, width="stretch")

st.subheader("Speedup vs shape")
if rd.is_cpu:
    st.info("No speedups for a CPU run: interpreter timings say nothing about kernel speed.")
else:
    st.plotly_chart(charts.speedup_vs_shape(rd.summary), key="speedup")

st.subheader("Correctness and validity")
problems = data.problems_table(rd.summary)
if len(problems):
    st.warning(f"{len(problems)} of {len(rd.summary)} cases failed, are incorrect or carry "
               "validity flags.")
    tables.show(problems, hide_index=True, width="stretch")
else:
    st.success(f"All {len(rd.summary)} cases ran, are correct and carry no validity flags.")
