"""The store contract: atomic writes, schema_version, unique run ids, DataFrame loaders."""
import json
import os

import pandas as pd
import pytest

from harness import store
from harness.errors import StoreError


def test_round_trip(tmp_path):
    run = store.create_run(tmp_path, "My Exp!", {"experiment": {"name": "x", "op": "softmax"},
                                                 "created_utc": "2026-01-01T00:00:00"})
    m = store.load_manifest(run)
    assert m["schema_version"] == store.SCHEMA_VERSION and m["run_id"] == run.name
    assert "-my-exp-" in run.name
    store.write_table(run, "samples", pd.DataFrame({"case_id": ["a", "a"], "i": [0, 1],
                                                    "ms": [1.5, 2.5]}))
    s = store.load_samples(run)
    assert list(s.columns) == store.SAMPLE_COLUMNS and s.ms.tolist() == [1.5, 2.5]
    assert store.load_metrics(run).empty and list(store.load_metrics(run).columns) == \
        store.METRIC_COLUMNS
    assert not [f for f in os.listdir(run) if f.endswith(".tmp")]  # temp files renamed away


def test_run_ids_are_unique(tmp_path):
    ids = {store.create_run(tmp_path, "same", {}).name for _ in range(30)}
    assert len(ids) == 30


def test_resolve_run(tmp_path):
    run = store.create_run(tmp_path, "abc", {})
    assert store.resolve_run(run.name, tmp_path) == tmp_path / run.name
    assert store.resolve_run(str(run), "elsewhere") == run
    assert store.resolve_run(run.name[:17], tmp_path) == tmp_path / run.name  # unique prefix
    with pytest.raises(StoreError, match="not found"):
        store.resolve_run("nope", tmp_path)


def test_corrupt_manifest_and_table_are_reported(tmp_path):
    run = store.create_run(tmp_path, "c", {})
    (run / "manifest.json").write_text("{ not json")
    with pytest.raises(StoreError, match="corrupt manifest"):
        store.load_manifest(run)
    (run / "results.parquet").write_bytes(b"garbage")
    with pytest.raises(StoreError, match="unreadable parquet"):
        store.load_results(run)
    rows = store.list_runs(tmp_path)
    assert rows[0]["error"] and "corrupt" in rows[0]["error"]


def test_case_status_counts_without_loading_the_run(tmp_path):
    run = store.create_run(tmp_path, "s", {})
    assert store.case_status_counts(run) == {}  # no cases table yet
    store.write_table(run, "cases", pd.DataFrame({"case_id": [], "status": []}))
    assert store.case_status_counts(run) == {}
    store.write_table(run, "cases", pd.DataFrame({"case_id": list("abc"), "status": ["ok"] * 3}))
    assert store.case_status_counts(run) == {"ok": 3}  # the footer's statistics settle it
    statuses = ["ok", "failed", "ok", "skipped", None]
    store.write_table(run, "cases", pd.DataFrame({"case_id": list("abcde"), "status": statuses}))
    assert store.case_status_counts(run) == {"ok": 2, "failed": 1, "skipped": 1, None: 1}
    store.check_tables(run, "cases", "results", "metrics")  # present ones readable, others absent
    (run / "cases.parquet").write_bytes(b"PAR1 not a parquet file")
    (run / "metrics.parquet").write_bytes(b"PAR1 not a parquet file")
    with pytest.raises(StoreError, match="cases.parquet: unreadable parquet"):
        store.case_status_counts(run)
    with pytest.raises(StoreError, match="metrics.parquet: unreadable parquet"):
        store.check_tables(run, "results", "metrics")


def test_newer_schema_is_refused(tmp_path):
    run = store.create_run(tmp_path, "n", {})
    m = json.loads((run / "manifest.json").read_text())
    m["schema_version"] = store.SCHEMA_VERSION + 1
    (run / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(StoreError, match="newer"):
        store.load_manifest(run)


def test_parts_last_record_wins_and_torn_lines_are_skipped(tmp_path):
    run = store.create_run(tmp_path, "p", {})
    store.append_part(run, "check", {"case_id": "a", "status": "error"})
    store.append_part(run, "check", {"case_id": "b", "status": "ok"})
    store.append_part(run, "check", {"case_id": "a", "status": "ok"})
    with open(store.parts_path(run, "check"), "a") as f:
        f.write('{"case_id": "c", "sta')  # a worker killed mid-write
    recs = {r["case_id"]: r["status"] for r in store.read_parts(run, "check")}
    assert recs == {"a": "ok", "b": "ok"}


def test_calibration_cache(tmp_path):
    store.save_calibration(tmp_path, "NVIDIA H200", {"copy_gbps": 4225.0})
    assert store.load_calibration("NVIDIA H200", tmp_path)["copy_gbps"] == 4225.0
    assert store.load_calibration("NVIDIA H100", tmp_path) is None


def test_clear_parts(tmp_path):
    run = store.create_run(tmp_path, "p", {})
    store.append_part(run, "ncu", {"case_id": "a", "status": "ok"})
    store.clear_parts(run, "ncu")
    store.clear_parts(run, "ncu")  # idempotent
    assert store.read_parts(run, "ncu") == []


def test_git_info_prefers_the_commit_the_sender_names(tmp_path, monkeypatch):
    """A checkout copied to a GPU box may carry a stale .git: HARNESS_GIT_SHA, when set, wins."""
    import subprocess

    from harness.machine.env import git_info

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.email=a@b", "-c", "user.name=a",
                    "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    monkeypatch.delenv("HARNESS_GIT_SHA", raising=False)
    own = git_info(tmp_path)
    assert len(own["git_sha"]) == 12 and own["git_dirty"] is False
    monkeypatch.setenv("HARNESS_GIT_SHA", "79007f0a48ca4a967d44")
    monkeypatch.setenv("HARNESS_GIT_DIRTY", "0")
    assert git_info(tmp_path) == {"git_sha": "79007f0a48ca", "git_dirty": False}
