"""dashboard.data (store roots, runs table, views) and the `harness dashboard` launcher."""
from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pandas as pd
import pytest
from dash_helpers import copy_run, make_corrupt_runs
from rich.console import Console

from dashboard import compare_data, data, launch, runs_table
from harness.cli import build_parser
from harness.analysis.summary import summary_frame
from harness.errors import HarnessError


def test_store_roots_precedence_and_examples(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    ex = str(data.EXAMPLES_ROOT.resolve())
    roots = data.store_roots(["--store", str(a), "--store", str(b)], {data.ENV_STORES: "x"})
    assert [r.path for r in roots] == [str(a), str(b), ex]
    assert [r.example for r in roots] == [False, False, True]
    roots = data.store_roots([], {data.ENV_STORES: f"{a}:{a}"})
    assert [r.path for r in roots] == [str(a), ex]  # deduplicated
    assert [r.path for r in data.store_roots([], {})] == [str(Path("runs").resolve()), ex]
    assert [r.path for r in data.store_roots(["--no-examples"], {})] == [
        str(Path("runs").resolve())]
    # pytest's own argv (no --store) must not be mistaken for store options
    assert data.store_roots(["-q", "--stepwise"], {data.ENV_STORES: str(a)})[0].path == str(a)


def test_runs_frame_marks_each_broken_run(example_run, user_store):
    bad = make_corrupt_runs(user_store, example_run)
    runs = runs_table.runs_frame(data.store_roots(["--store", str(user_store)], {}))
    problem = dict(zip(runs.run_id, runs.problem))
    assert "corrupt manifest" in problem[bad["bad_json"].name]
    assert "unreadable parquet" in problem[bad["bad_parquet"].name]
    assert "no cases recorded" in problem[bad["half"].name]
    assert problem[example_run.name] == ""
    ex = runs[runs.run_id == example_run.name].iloc[0]
    assert (ex.source, ex.gpu, ex.cases, ex.ok, ex.status) == ("example", "NVIDIA H200", 36, 36,
                                                               "complete")


def test_the_runs_table_of_a_large_store_reads_each_run_once(monkeypatch, tmp_path):
    """The runs table walks every run on every rerun of the app. With more runs than the run
    cache held (64; the committed examples alone are over 100) each walk evicted what the next
    one needed first, so every interaction reloaded every run. Its per-run numbers are cached
    apart, for any size, and come from the cases' statuses: no run is loaded whole (summarising
    every example made the first page take most of a minute)."""
    roots = data.store_roots(["--no-examples", "--store", str(data.EXAMPLES_ROOT)], {})
    n_runs = sum((d / "manifest.json").exists() for d in data.EXAMPLES_ROOT.iterdir())
    assert n_runs > 64  # the case that thrashed
    reads, whole = [], []
    real = runs_table.run_counts
    monkeypatch.setattr(runs_table, "run_counts", lambda *a: reads.append(a[0]) or real(*a))
    monkeypatch.setattr(data, "_read_run", lambda *a: whole.append(a[0]))
    runs_table._cached_counts.clear()
    runs_table._runs_frame.clear()
    first = runs_table.runs_frame(roots)
    assert len(reads) == len(first) == n_runs and not whole
    second = runs_table.runs_frame(roots)
    assert len(reads) == n_runs  # nothing read again
    pd.testing.assert_frame_equal(first, second)
    some = pd.concat([first[first["not ok"] > 0].head(2), first[first["not ok"] == 0].head(2)])
    for r in some.itertuples():  # the numbers the run's summary gives
        df = summary_frame(r.path)
        assert (r.cases, r.ok) == (len(df), (df.status == "ok").sum()), r.run_id


def test_the_runs_table_is_read_again_only_when_a_run_changes(monkeypatch, example_run,
                                                               user_store):
    """Every rerun of every page asks for the runs table: it reads no manifest while no run
    directory changed, and sees a new run, a rewritten manifest and a removed run at once. A
    `running` run whose driver died meanwhile shows `interrupted` though no file changed."""
    import subprocess
    import sys

    from harness import store

    roots = data.store_roots(["--no-examples", "--store", str(user_store)], {})
    a = copy_run(example_run, user_store, minutes_later=1)
    c = copy_run(example_run, user_store, minutes_later=0)  # complete, the oldest
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        m = store.load_manifest(a)
        m.update(status="running", driver={**store.driver_record(), "pid": live.pid})
        store.write_manifest(a, m)
        reads = []
        real = store.load_manifest
        monkeypatch.setattr(store, "load_manifest", lambda d: reads.append(Path(d).name)
                            or real(d))
        first = runs_table.runs_frame(roots)
        assert list(first.status) == ["running", "complete"] and set(reads) == {a.name, c.name}
        reads.clear()
        assert runs_table.runs_frame(roots).equals(first) and reads == [a.name]  # the running one
        b = copy_run(example_run, user_store, minutes_later=2)
        assert list(runs_table.runs_frame(roots).run_id) == [b.name, a.name, c.name]  # newest first
        live.kill()
        live.wait()
        reads.clear()
        again = runs_table.runs_frame(roots)  # no file changed: only the running run's status
        assert dict(zip(again.run_id, again.status)) == {a.name: "interrupted",
                                                         b.name: "complete",
                                                         c.name: "complete"}
        assert reads == [a.name]
        m = store.load_manifest(b)
        m["experiment"]["name"] = "renamed"
        store.write_manifest(b, m)
        assert runs_table.runs_frame(roots).set_index("run_id").experiment[b.name] == "renamed"
        import shutil

        shutil.rmtree(b)
        assert list(runs_table.runs_frame(roots).run_id) == [a.name, c.name]
    finally:
        live.kill()
        live.wait()


def test_selection_and_default_run():
    table = pd.DataFrame({"run_id": ["new", "mid", "old"], "path": ["/n", "/m", "/o"],
                          "problem": ["", "broken", ""]})
    assert runs_table.selection_from_rows(table, [2, 0]) == ("/n", "/o")  # newer is the run
    assert runs_table.selection_from_rows(table, [1]) == ("/m", data.NONE)
    assert runs_table.selection_from_rows(table, []) == (data.NONE, data.NONE)
    assert runs_table.default_run(table) == "/n"
    assert runs_table.default_run(table, "old") == "/o"
    assert runs_table.default_run(table, "nope") == "/n"
    assert runs_table.find_run(table, "mid") == "/m"
    assert runs_table.find_run(table, "nope") == data.NONE
    assert runs_table.default_run(table[table.problem != ""]) == "/m"  # only a broken one: its card


def test_kernel_rows_match_the_nsys_totals(example_run):
    rd = data.load_run(str(example_run))
    source, kernels, totals = data.kernel_rows(rd.metrics)
    assert source == "nsys"
    per_case = kernels.groupby("case_id").kernel_launches.sum()
    assert (per_case == totals.kernel_count.reindex(per_case.index)).all()
    assert "_softmax_rows" in set(kernels.short_name)


def test_moved_metrics_keeps_stall_changes():
    m = pd.DataFrame([
        {"key": "k", "impl": "t", "name": "duration_us", "base": 10.0, "cand": 8.0,
         "delta": -2.0, "rel_delta": -0.2},
        {"key": "k", "impl": "t", "name": "registers_per_thread", "base": 32.0, "cand": 33.0,
         "delta": 1.0, "rel_delta": 1 / 32},
        {"key": "k", "impl": "t", "name": "top_stall", "base": "wait", "cand": "barrier",
         "delta": None, "rel_delta": None}])
    out = compare_data.moved_metrics(m, 0.10)
    assert list(out.name) == ["top_stall", "duration_us"]


def test_launch_command_binds_localhost(tmp_path):
    argv = launch.command([str(tmp_path)], 8600)
    assert argv[1:3] == [str(launch.SERVE), "run"] and argv[3] == str(launch.APP)
    i = argv.index("--server.address")
    assert argv[i + 1] == "127.0.0.1"
    assert argv[argv.index("--server.port") + 1] == "8600"
    assert argv[argv.index("--server.headless") + 1] == "true"
    assert argv[argv.index("--") + 1:] == ["--store", str(tmp_path.resolve())]
    # what the launcher passes is what the app reads
    assert data.store_roots(argv[argv.index("--") + 1:], {})[0].path == str(tmp_path.resolve())


def test_launch_refuses_a_busy_port(tmp_path):
    args = build_parser().parse_args(["dashboard", "--store", str(tmp_path), "--port", "0"])
    assert args._module is launch
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = argparse.Namespace(store=[str(tmp_path)], port=s.getsockname()[1],
                                  no_examples=False)
        with pytest.raises(HarnessError, match="in use"):
            launch.main(busy, Console())
    afile = tmp_path / "f"
    afile.write_text("")
    with pytest.raises(HarnessError, match="not a directory"):
        launch.main(argparse.Namespace(store=[str(afile)], port=0, no_examples=False),
                    Console())
