"""Runs: every run in the stores; filter, then pick one or two (the sidebar follows)."""
import streamlit as st

from dashboard import data, runs_table, tables

st.title("Runs")
runs = st.session_state["runs"]
if not len(runs):
    st.info("No runs in the stores yet. Make one with "
            "`python -m harness run experiments/softmax.yaml`.")
    st.stop()

c1, c2 = st.columns(2)
exps = c1.multiselect("Experiment", sorted(set(runs.experiment) - {""}), key="filter_experiment")
ops = c2.multiselect("Op", sorted(set(runs.op) - {""}), key="filter_op")
table = runs_table.filter_runs(runs, exps, ops)


def _pick():
    picked = st.session_state["runs_table"].selection.rows
    run, base = runs_table.selection_from_rows(table, picked)
    if run:
        st.session_state["run_a"], st.session_state["run_b"] = run, base


st.caption("Select one or two rows: the newer becomes the **Run** of the other pages, the older "
           "the **baseline** of Compare. `example` runs are real GPU runs committed with the "
           "repository; `user` runs are yours.")
tables.show(table.drop(columns="path"), key="runs_table", on_select=_pick,
            selection_mode="multi-row", hide_index=True, width="stretch",
            column_config={"problem": st.column_config.TextColumn("problem", width="medium")})
for r in table[table.problem != ""].itertuples():
    data.error_card(r.run_id, r.problem)
