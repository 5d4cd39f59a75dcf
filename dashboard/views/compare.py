"""Compare: the baseline run vs the run, as `harness compare` judges them."""
import streamlit as st

from dashboard import compare_data, data, figures, tables

st.title("Compare")
roots = st.session_state["roots"]
cand_path, base_path = st.session_state.get("run_a"), st.session_state.get("run_b")
if not cand_path or not base_path:
    st.info("Pick a baseline in the sidebar (**Compare with**), or select two rows on the Runs "
            "page: the older is the baseline, the newer the candidate.")
    st.stop()
if cand_path == base_path:
    st.warning("The run and the baseline are the same run: pick two different runs.")
    st.stop()
base, cand = data.load_run(base_path, roots), data.load_run(cand_path, roots)
for rd in (base, cand):
    if rd.error:
        data.error_card(rd.run_id, rd.error, rd.detail)
if base.error or cand.error:
    st.stop()

c1, c2 = st.columns(2)
c1.markdown(f"**baseline** · {base.title}  \n`{base.path}`")
c2.markdown(f"**candidate** · {cand.title}  \n`{cand.path}`")
anyway = st.toggle("Compare anyway (even if the environments differ)", key="compare_anyway",
                   help="Runs from different GPUs, drivers, clocks or device kinds are not "
                        "comparable; with this on the result is shown, labelled INCOMPARABLE.")
res = compare_data.compare(base.path, cand.path, allow_incomparable=anyway)
if res["refused"]:
    st.error(f"Refused: {res['refused']}", icon=":material/block:")
    if res["incomparable"]:
        st.caption("Turn on **Compare anyway** to see the numbers regardless.")
    st.stop()

st.subheader(res["headline"])
for p in res["problems"]:
    st.warning(f"incomparable: {p}")
for n in res["notes"]:
    st.info(n)
time = res["time"]
counts = time["mark"].value_counts()
for col, mark in zip(st.columns(len(compare_data.MARKS)), compare_data.MARKS):
    col.metric(compare_data.MARKS[mark], int(counts.get(mark, 0)))
if time["ratio"].notna().any():
    st.plotly_chart(figures.ratio_chart(time), key="ratios")
tables.show(compare_data.time_table(time), hide_index=True, width="stretch")

st.subheader("Profiler metrics that moved")
st.caption("Metrics of the dominant kernel that moved beyond `harness compare`'s thresholds; "
           "narrow them further with the slider.")
min_rel = st.slider("minimum relative change (%)", 0, 100, 0, step=1, key="min_rel") / 100
moved = compare_data.moved_metrics(res["metrics"], min_rel)
if len(moved):
    tables.show(moved, hide_index=True, width="stretch")
else:
    st.info("No profiler metric moved that much (or the runs share no profiled cases).")
