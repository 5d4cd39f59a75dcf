"""Run: since the previous run, the summary table, speedup vs shape, correctness and validity
flags."""
import streamlit as st

from dashboard import data, tables
from dashboard.speedup_svg import speedup_page
from harness.present import charts
from harness.analysis.since import change_header

st.title("Run")
rd = data.selected_run()
st.caption(rd.title)
st.markdown(" · ".join(f"**{k}** {v}" for k, v in data.run_facts(rd).items()))
if rd.is_cpu:
    st.warning("CPU run: Triton kernels ran in the interpreter; times are CPU wall-clock, useful "
               "for checking correctness, not for performance.")

st.subheader("Since the previous run")
since = data.since(rd)
if since is None:
    st.caption("No previous run recorded: this run was made before `harness run` paired runs.")
elif since.message:
    st.info(since.message)
else:
    st.markdown(f"**{data.md_escape(since.title)}**: {data.md_escape(since.against.why)}")
    for note in since.notes:
        st.caption(data.md_escape(note))
    st.dataframe(data.since_impl_table(since), hide_index=True, width="stretch")
    st.markdown(data.md_escape(change_header(since)))
    lines = [f"- {data.md_escape(c.key)}: **{data.md_escape(c.text)}**"
             + "".join(f"; {data.md_escape(e)}" for e in c.evidence) for c in since.changes]
    if since.n_more:
        lines.append(f"- … and {since.n_more} more")
    if lines:
        st.markdown("\n".join(lines))

st.subheader("Summary")
tables.show(data.summary_table(rd.summary, rd.is_cpu, rd.manifest), hide_index=True,
            width="stretch")

st.subheader("Speedup vs shape")
if rd.is_cpu:
    st.info("No speedups for a CPU run: interpreter timings say nothing about kernel speed.")
else:
    bars, baseline = charts.speedup_bars(rd.summary)
    if len(bars):
        st.iframe(speedup_page(bars, baseline), height="content")
    else:
        st.info("No speedups: no correct, timed candidate case has a baseline case of its "
                "shape.")

st.subheader("Correctness and validity")
problems = data.problems_table(rd.summary)
if len(problems):
    st.warning(f"{len(problems)} of {len(rd.summary)} cases failed, are incorrect or carry "
               "validity flags.")
    tables.show(problems, hide_index=True, width="stretch")
else:
    st.success(f"All {len(rd.summary)} cases ran, are correct and carry no validity flags.")
