"""Every committed example run still loads: its manifest through the store, its tables' parquet
schemas and row counts (read from the file footers, not the data). Cheap at any number of
examples; the pages and reports are rendered for a representative handful only
(tests/example_runs.py), in test_report_examples.py and the dashboard tests."""
from __future__ import annotations

import pyarrow.parquet as pq
from example_runs import all_runs, representative

from harness import store

# columns added after the first examples were stored: older runs lack them, readers cope
ADDED_LATER = {"cases": {"base_impl", "forced_config"},
               "results": {"config", "config_source", "code_hash", "compiled",
                           "sm_clock_timed_mhz", "process_medians_ms"},
               "samples": {"process"}}


def test_there_are_examples_and_a_handful_is_rendered():
    runs = all_runs()
    assert len(runs) >= 10
    handful = representative()
    assert set(handful) <= set(runs) and len(handful) < len(runs)


def test_every_example_loads():
    problems = []
    for run in all_runs():
        try:
            m = store.load_manifest(run)
        except Exception as exc:  # noqa: BLE001 - collected, reported together below
            problems.append(f"{run.name}: manifest: {exc}")
            continue
        if m.get("run_id") != run.name or not m.get("experiment", {}).get("op"):
            problems.append(f"{run.name}: manifest names {m.get('run_id')!r}, "
                            f"op {m.get('experiment', {}).get('op')!r}")
        rows = {}
        for table in store.TABLES:
            path = run / f"{table}.parquet"
            if not path.exists():
                continue
            meta = pq.read_metadata(path)
            missing = set(store.COLUMNS[table]) - set(meta.schema.names) - \
                ADDED_LATER.get(table, set())
            if missing:
                problems.append(f"{run.name}: {table}.parquet lacks {sorted(missing)}")
            rows[table] = meta.num_rows
        if not rows.get("cases"):
            problems.append(f"{run.name}: no cases")
        elif "results" in rows and rows["results"] != rows["cases"]:
            problems.append(f"{run.name}: {rows['results']} results for {rows['cases']} cases")
    assert not problems, "\n".join(problems)


def test_the_oldest_example_reads_whole_through_the_store():
    """The oldest example's frames read through the store (what the check above trusts)."""
    path = all_runs()[0]
    cases, results = store.load_cases(path), store.load_results(path)
    assert len(cases) == len(results) > 0
    assert set(cases.case_id) == set(results.case_id)
