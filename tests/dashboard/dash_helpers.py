"""Helpers for the dashboard tests: the committed example runs, copies of them, corrupt runs.

Copies are made with the store's own writers; the samples of a copy's `faster_impl` cases are
scaled so that Compare has a real, known difference to find (x0.8 time: 1.25x faster).
"""
from __future__ import annotations

import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

from dashboard import data
from harness import store

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "dashboard" / "app.py")


def gpu_example() -> Path:
    """The first committed example captured on a GPU with ncu and nsys metrics."""
    for r in store.list_runs(data.EXAMPLES_ROOT):
        if r.get("error") or r.get("device") != "cuda":
            continue
        m = store.load_metrics(r["path"])
        if {"ncu", "nsys"} <= set(m.source):
            return Path(r["path"])
    raise AssertionError(f"no GPU example run with ncu+nsys metrics under {data.EXAMPLES_ROOT}")


def copy_run(src: Path, root: Path, *, minutes_later: int = 7 * 24 * 60,
             faster_impl: str | None = None, env_changes: dict | None = None) -> Path:
    """A copy of `src` under `root` with a new run id (and optionally faster samples or a
    different env fingerprint)."""
    m = store.load_manifest(src)
    created = datetime.fromisoformat(m["created_utc"]) + timedelta(minutes=minutes_later)
    run_id = store.new_run_id(m["experiment"]["name"], created.astimezone(timezone.utc))
    dst = root / run_id
    shutil.copytree(src, dst)
    m.update(run_id=run_id, created_utc=created.isoformat())
    if env_changes:
        m["env"] = {**m["env"], **env_changes}
    m["env"]["git_sha"] = "0123456789abcdef0123456789abcdef01234567"
    store.write_manifest(dst, m)
    if faster_impl:
        cases = store.load_cases(dst)
        ids = set(cases[cases.impl == faster_impl].case_id)
        s = store.load_samples(dst)
        s.loc[s.case_id.isin(ids), "ms"] *= 0.8
        store.write_table(dst, "samples", s)
        res = store.load_results(dst)
        for c in ("median_ms", "p20_ms", "p80_ms"):
            res.loc[res.case_id.isin(ids), c] *= 0.8
        store.write_table(dst, "results", res)
    return dst


def make_corrupt_runs(root: Path, example: Path) -> dict[str, Path]:
    """Three broken runs: bad manifest JSON, an unreadable parquet, tables never written."""
    bad_json = root / "20991231T000000Z-softmax-bad1"
    shutil.copytree(example, bad_json)
    (bad_json / "manifest.json").write_text('{"schema_version": 1, "experiment": ')
    bad_parquet = copy_run(example, root, minutes_later=5)
    (bad_parquet / "metrics.parquet").write_bytes(b"PAR1 this is not a parquet file")
    half = root / "20991231T000000Z-softmax-half"
    half.mkdir()
    m = store.load_manifest(example)
    m.update(run_id=half.name, status="running")
    store.write_manifest(half, m)
    return {"bad_json": bad_json, "bad_parquet": bad_parquet, "half": half}
