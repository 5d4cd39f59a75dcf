"""The runs table every page's sidebar reads: one row per run under the store roots, cached on a
stamp of every run directory, and the selection logic over it (filters, labels, the default
run, rows picked -> run and baseline). Reads manifests and the cases' statuses, never a run
whole (dashboard.data loads a run for the pages that show it)."""
from __future__ import annotations

import hashlib
import os
from datetime import datetime, timezone

import pandas as pd
import streamlit as st

from dashboard.data import NONE, Root, git_cell, stamp
from harness import store
from harness.errors import HarnessError


RUN_COLUMNS = ["source", "run_id", "experiment", "op", "created", "gpu", "git", "status",
               "cases", "ok", "not ok", "problem", "path"]


def _utc(text: str | None) -> datetime | None:
    """An ISO 8601 time (the manifests' created_utc) in UTC; None when absent or malformed
    (pd.to_datetime guessed the format anew for every run of the runs table)."""
    try:
        t = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


def runs_frame(roots: list[Root]) -> pd.DataFrame:
    """One row per run under the roots, newest first; unreadable runs carry `problem`.

    Every page's every rerun asks for it (the sidebar's run selectors): the table is cached
    on a stamp of every run directory (`stores_stamp`), so a rerun reads no manifest unless a
    run changed or appeared (reading 177 example manifests and looking up their counts took
    0.15-0.2 s of each rerun on a 2-core machine). A `running` run's status is read again on
    every call: its driver may have died without writing anything (store.effective_status)."""
    df = _runs_frame(roots, stores_stamp(roots))
    running = df.index[df.status == "running"]
    for i in running:
        try:
            df.at[i, "status"] = store.effective_status(store.load_manifest(df.at[i, "path"]))
        except Exception:  # unreadable now: the next rerun's stamp differs and reads it whole
            pass
    return df


def stores_stamp(roots: list[Root]) -> str:
    """A digest of the stamps (`stamp`) of every directory under the roots: changes when a run
    is added, removed or any of its files is written (the manifest, by a rename)."""
    h = hashlib.blake2b(digest_size=16)
    for r in roots:
        h.update(f"\0{r.path}\0".encode())
        try:
            dirs = sorted(e.name for e in os.scandir(r.path)
                          if not e.name.startswith(".") and e.is_dir())
        except OSError:
            continue
        for name in dirs:
            h.update(f"{name}:{stamp(os.path.join(r.path, name))};".encode())
    return h.hexdigest()


@st.cache_data(show_spinner=False, max_entries=8)
def _runs_frame(roots: list[Root], stores: str) -> pd.DataFrame:
    """The runs table, read; `stores` (stores_stamp) only keys the cache."""
    rows = []
    example_roots = {r.path for r in roots if r.example}
    for r in store.list_runs(*(r.path for r in roots)):
        n_cases, n_ok, error = (0, 0, r["error"]) if r.get("error") else _cached_counts(
            str(r["path"]), stamp(r["path"]), r.get("status"))
        created = _utc(r.get("created"))
        rows.append({
            "source": "example" if (r["root"] in example_roots or r.get("example")) else "user",
            "run_id": r["run_id"],
            "experiment": r.get("experiment") or "",
            "op": r.get("op") or "",
            "created": created.strftime("%Y-%m-%d %H:%M") if created else "",
            "gpu": r.get("gpu") or ("CPU" if r.get("device") == "cpu" else "-"),
            "git": git_cell(r),
            "status": r.get("status") or ("unreadable" if error else "-"),
            "cases": n_cases,
            "ok": n_ok,
            "not ok": n_cases - n_ok,
            "problem": error or "",
            "path": r["path"],
            "_sort": r.get("created") or "",
        })
    if not rows:
        return pd.DataFrame(columns=RUN_COLUMNS)
    df = pd.DataFrame(rows).sort_values(["_sort", "run_id"], ascending=False)
    return df.drop(columns="_sort").reset_index(drop=True)[RUN_COLUMNS]


def filter_runs(runs: pd.DataFrame, experiments: list[str], ops: list[str]) -> pd.DataFrame:
    out = runs
    if experiments:
        out = out[out.experiment.isin(experiments)]
    if ops:
        out = out[out.op.isin(ops)]
    return out.reset_index(drop=True)


def run_labels(runs: pd.DataFrame) -> dict[str, str]:
    """path -> the label the run selectors show for it (one pass over the table: a lookup per
    option made the sidebar's two selectors of 161 runs cost seconds per rerun)."""
    labels = {NONE: "(none)"}
    for r in runs.itertuples():
        tag = " [example]" if r.source == "example" else ""
        bad = " ⚠ unreadable" if r.problem else ""
        labels[r.path] = f"{r.run_id} · {r.experiment or '?'} · {r.gpu}{tag}{bad}"
    return labels


def find_run(runs: pd.DataFrame, ref: str | None) -> str:
    """The path of the run named by `ref` (run id or path), else ''."""
    hit = runs[(runs.run_id == ref) | (runs.path == ref)] if ref else runs.iloc[0:0]
    return hit.path.iloc[0] if len(hit) else NONE


def default_run(runs: pd.DataFrame, query_run: str | None = None) -> str:
    """The run named in the URL (?run=<run_id>), else the newest readable run, else ''."""
    if find_run(runs, query_run):
        return find_run(runs, query_run)
    good = runs[runs.problem == ""]
    if len(good):
        return good.path.iloc[0]
    return runs.path.iloc[0] if len(runs) else NONE


def selection_from_rows(table: pd.DataFrame, rows: list[int]) -> tuple[str, str]:
    """Rows picked in the (newest-first) runs table -> (run, baseline): newer is the run."""
    paths = [table.path.iloc[i] for i in sorted(rows) if 0 <= i < len(table)]
    if not paths:
        return NONE, NONE
    return paths[0], paths[1] if len(paths) > 1 else NONE


def run_counts(path: str, status: str | None = None) -> tuple[int, int, str | None]:
    """(cases, ok cases, problem) of a run: what the runs table shows of it, read from the
    cases' status column and the footers of the tables the pages load, never the run whole
    (summarising every example run for the first page took most of a minute). A table damaged
    inside a readable footer shows on the run's own pages, as an error card."""
    try:
        counts = store.case_status_counts(path)
        store.check_tables(path, "results", "metrics")
    except HarnessError as exc:  # StoreError: unreadable parquet
        return 0, 0, str(exc)
    if not counts:
        return 0, 0, (f"{path}: no cases recorded (status {status!r}; the cases table is "
                      "missing or empty: a half-written run?)")
    return sum(counts.values()), counts.get("ok", 0), None


@st.cache_data(show_spinner=False, max_entries=4096)
def _cached_counts(path: str, stamp: str, status: str | None
                   ) -> tuple[int, int, str | None]:
    """run_counts, cached apart from the runs (a few numbers per run, so that every run of a
    large store stays cached: through the RunData cache of 64 runs, each walk of a larger store
    evicted the runs the next one needed first)."""
    return run_counts(path, status)
