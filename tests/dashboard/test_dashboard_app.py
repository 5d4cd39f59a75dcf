"""Every dashboard page rendered by streamlit's AppTest over the committed example runs.

Expectations are computed from the runs' own tables (via harness.store / analysis), so adding
or replacing an example run does not break the tests, while a page that shows the wrong thing
does.
"""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pandas as pd
import pytest
from dash_helpers import APP, copy_run, make_corrupt_runs
from example_runs import newest_per_kind
from streamlit.testing.v1 import AppTest

from dashboard import data
from harness import store
from harness.analysis.summary import kernel_view, summary_frame

SVG = "{http://www.w3.org/2000/svg}"
PAGES = {"run": "Run", "roofline": "Roofline", "stalls": "Stalls & occupancy",
         "compare": "Compare", "history": "History", "timeline": "Timeline"}


def _app(monkeypatch, store_root, run=None, base=None) -> AppTest:
    monkeypatch.setenv(data.ENV_STORES, str(store_root))
    monkeypatch.delenv(data.ENV_NO_EXAMPLES, raising=False)
    at = AppTest.from_file(APP, default_timeout=60)
    if run:
        at.query_params["run"] = run.name
    if base:
        at.query_params["base"] = base.name
    at.run()
    _ok(at)
    return at


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _page(at: AppTest, name: str) -> AppTest:
    at.switch_page(f"views/{name}.py")
    at.run()
    _ok(at)
    assert at.title[0].value == PAGES[name]
    return at


def _figures(at: AppTest) -> list[dict]:
    return [json.loads(el.proto.spec) for el in at.get("plotly_chart")]


def _speedup_svg(at: AppTest) -> list[ET.Element]:
    """The SVG of each speedup chart (an st.iframe of speedup_svg's page)."""
    return [ET.fromstring(re.search(r"<svg.*</svg>", el.proto.srcdoc, re.S).group(0))
            for el in at.get("iframe")]


def _texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def _flagged(run) -> int:
    df = summary_frame(run)
    return int(sum(r["status"] != "ok" or r["correct"] is False or
                   json.loads(r["flags"] or "[]") != [] for r in df.to_dict("records")))


def _readable(el) -> pd.DataFrame:
    """Assert that a table reads like the terminal: no cell says None or nan, and every float
    column is rounded and has a display format. Returns the shown frame."""
    df, cfg = el.value, json.loads(el.proto.columns or "{}")
    for col in df.columns:
        s = df[col]
        assert not s.isna().any(), f"{col}: missing values would read 'None'"
        assert not s.astype(str).isin(["None", "nan", "NaN", "<NA>"]).any(), col
        if pd.api.types.is_float_dtype(s):
            assert cfg.get(col, {}).get("type_config", {}).get("format"), f"{col}: no format"
            raw = [v for v in s if not (float(v).is_integer() or float(f"{v:.5g}") == v)]
            assert not raw, f"{col}: unrounded {raw[:3]}"
    return df


def test_runs_and_run_pages_read_like_the_terminal(monkeypatch, example_run, faster_copy):
    at = _app(monkeypatch, faster_copy.parent, run=example_run)
    _readable(at.dataframe[0])  # Runs
    _page(at, "run")
    summary = _readable(at.dataframe[0])
    cfg = json.loads(at.dataframe[0].proto.columns)
    assert cfg["median ms"]["type_config"]["format"] == "%.4g"
    assert cfg["speedup"]["type_config"]["format"] == "%.2fx"
    assert set(summary.dtype) <= {"fp16", "bf16", "fp32"}
    dram = summary["DRAM %"]  # ncu-profiled cases only: the others read "-"
    assert (dram == "-").any() and dram[dram != "-"].str.fullmatch(r"\d+%").all()
    assert summary["speedup"].between(0.01, 100).all()
    for el in at.dataframe[1:]:
        _readable(el)


def test_every_table_of_every_page_is_readable(monkeypatch, example_run, faster_copy):
    at = _app(monkeypatch, faster_copy.parent, run=faster_copy, base=example_run)
    for name in PAGES:
        _page(at, name)
        for el in at.dataframe:
            _readable(el)


def test_runs_page_lists_examples_beside_user_runs(monkeypatch, example_runs, faster_copy):
    at = _app(monkeypatch, faster_copy.parent)
    assert at.title[0].value == "Runs"
    table = at.dataframe[0].value
    source = dict(zip(table.run_id, table.source))
    assert source[faster_copy.name] == "user"
    assert {source[r.name] for r in example_runs} == {"example"}
    assert len(table) == len(example_runs) + 1 and not at.error
    # newest first; the sidebar defaults to the newest readable run (the copy, a week later:
    # newer than every example)
    assert table.run_id.iloc[0] == faster_copy.name
    assert at.session_state["run_a"] == str(faster_copy.resolve())
    assert "[example]" in " ".join(at.sidebar.selectbox(key="run_a").options)
    at.multiselect(key="filter_op").set_value(["softmax"]).run()
    _ok(at)
    n_softmax = 1 + sum(store.load_manifest(r)["experiment"]["op"] == "softmax"
                        for r in example_runs)
    assert len(at.dataframe[0].value) == n_softmax


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory):
    """One empty user store for the examples' renders: the dashboard's caches are keyed by the
    stores it reads, so the runs after the first render from cache, as a browser session's do."""
    return tmp_path_factory.mktemp("empty_store")


@pytest.mark.parametrize("run", newest_per_kind(), ids=lambda p: p.name)
def test_examples_render_on_every_page(monkeypatch, empty_store, run):
    """A fresh clone shows something real: the newest example of each kind (op, mode, config
    grid or not) and the runs tests name, each page, no error. That every example loads is
    test_examples_load's; the reports of the newest run of each experiment are rendered in
    test_report_examples."""
    at = _app(monkeypatch, empty_store, run=run)
    for name in PAGES:
        _page(at, name)
        assert not at.error, (run.name, name, _texts(at.error))
    assert run.name in at.query_params["run"]


@pytest.mark.parametrize("page, charts", [
    ("run", 1), ("roofline", 1), ("stalls", 1), ("history", 1), ("timeline", 2)])
def test_page_widgets_and_figures(monkeypatch, user_store, example_run, page, charts):
    at = _page(_app(monkeypatch, user_store, run=example_run), page)
    assert not at.error
    assert len(at.get("plotly_chart")) + len(at.get("iframe")) == charts
    assert len(at.dataframe) >= 1
    assert example_run.name in at.caption[0].value or page == "history"


def test_run_page_summary_speedups_and_flags(monkeypatch, user_store, example_run):
    at = _page(_app(monkeypatch, user_store, run=example_run), "run")
    summary = at.dataframe[0].value
    assert len(summary) == len(store.load_cases(example_run))
    assert {"impl", "median ms", "speedup", "GB/s", "flags"} <= set(summary.columns)
    assert "example run" in at.caption[0].value
    flagged = _flagged(example_run)
    if flagged:
        assert len(at.dataframe[1].value) == flagged
        assert f"{flagged} of" in _texts(at.warning)
    else:
        assert "no validity flags" in _texts(at.success)
    (svg,) = _speedup_svg(at)  # speedup vs shape: one bar per correct candidate case
    bars = svg.findall(f".//{SVG}rect[@class='bar']")
    df = summary_frame(example_run)
    cand = df[(df.role == "candidate") & (df.status == "ok") & (df.correct != False)  # noqa: E712
              & df.speedup_vs_baseline.notna()]
    assert 0 < len(bars) == len(cand)
    assert {b.get("data-impl") for b in bars} == set(cand.impl)
    tips = sorted(float(b.get("data-tip").split("speedup (x) ")[1].split()[0]) for b in bars)
    assert tips == pytest.approx(sorted(cand.speedup_vs_baseline), abs=0.006)
    assert not at.get("plotly_chart")


def test_roofline_ceilings_and_intensity_toggle(monkeypatch, user_store, example_run):
    at = _page(_app(monkeypatch, user_store, run=example_run), "roofline")
    (fig,) = _figures(at)
    names = [t["name"] for t in fig["data"]]
    assert set(store.load_cases(example_run).impl) <= set(names)
    assert any(n.startswith("DRAM") for n in names) and any("tensor" in n for n in names)
    assert fig["layout"]["xaxis"]["type"] == "log" and fig["layout"]["yaxis"]["type"] == "log"
    at.radio(key="intensity").set_value("counted").run()
    _ok(at)
    (fig,) = _figures(at)
    assert [t for t in fig["data"] if t.get("mode") == "markers"]
    assert "counted" in fig["layout"]["title"]["text"]
    counted = summary_frame(example_run).counted_intensity.notna().sum()
    assert len(at.dataframe[0].value) == counted > 0  # the ncu-profiled cases


def test_stalls_page_has_stalls_and_occupancy(monkeypatch, user_store, example_run):
    at = _page(_app(monkeypatch, user_store, run=example_run), "stalls")
    (fig,) = _figures(at)
    assert fig["layout"]["barmode"] == "stack"
    assert "long_scoreboard" in {t["name"] for t in fig["data"]}  # softmax streams memory
    occ = at.dataframe[0].value
    df = summary_frame(example_run)
    assert len(occ) == df.achieved_occupancy_pct.notna().sum() > 0
    assert set(occ["limiter"].dropna()) == set(df.occupancy_limiter.dropna())


def test_timeline_page_per_case(monkeypatch, user_store, example_run):
    kv = kernel_view(store.load_metrics(example_run))
    case = kv.kernel_count.idxmax()  # the case with the most kernels in its range
    at = _page(_app(monkeypatch, user_store, run=example_run), "timeline")
    at.selectbox(key="timeline_case").set_value(case).run()
    _ok(at)
    kernels = at.dataframe[0].value
    assert len(kernels) == len(json.loads(kv.loc[case, "kernel_names"]))
    assert kernels.kernel_launches.sum() == kv.loc[case, "kernel_count"]
    assert (kernels.kernel_time_us > 0).all()
    assert case in _figures(at)[1]["layout"]["title"]["text"]


def test_history_across_runs(monkeypatch, example_runs, example_run, faster_copy):
    at = _page(_app(monkeypatch, faster_copy.parent, run=faster_copy), "history")
    (fig,) = _figures(at)
    gpu = store.load_manifest(example_run)["env"]["gpu_name"]
    same_gpu = [r for r in example_runs if store.load_manifest(r)["env"].get("gpu_name") == gpu
                and store.load_manifest(r)["experiment"]["op"] == "softmax"]
    xs = fig["layout"]["xaxis"]["categoryarray"]
    assert len(xs) == len(same_gpu) + 1  # oldest first: the copy is a week later, last
    assert xs[-1].startswith("01234567")  # the copy's git sha
    assert {t["name"] for t in fig["data"]} <= set(store.load_cases(example_run).impl)


def test_compare_finds_the_faster_triton(monkeypatch, example_run, faster_copy):
    at = _page(_app(monkeypatch, faster_copy.parent, run=faster_copy, base=example_run),
               "compare")
    assert not at.error
    time = at.dataframe[0].value
    cases = store.load_cases(example_run)
    triton = time[time.key.str.startswith("triton ")]
    assert len(time) == len(cases) and len(triton) == (cases.impl == "triton").sum()
    assert triton["mark"].str.contains("faster").all()
    assert not time[~time.key.str.startswith("triton ")]["mark"].str.contains("faster").any()
    (fig,) = _figures(at)
    assert "ratio" in fig["layout"]["title"]["text"]
    assert "faster" in at.subheader[0].value


def test_compare_refuses_other_gpu_until_told(monkeypatch, example_run, user_store):
    other = copy_run(example_run, user_store, env_changes={"gpu_name": "NVIDIA H100 80GB HBM3"})
    at = _page(_app(monkeypatch, user_store, run=other, base=example_run), "compare")
    assert "not comparable" in _texts(at.error) and "GPU differs" in _texts(at.error)
    assert not at.get("plotly_chart")
    at.toggle(key="compare_anyway").set_value(True).run()
    _ok(at)
    assert not at.error
    assert "INCOMPARABLE" in at.subheader[0].value
    assert "GPU differs" in _texts(at.warning)
    assert len(at.get("plotly_chart")) == 1


def test_corrupt_runs_get_error_cards_only(monkeypatch, example_run, example_runs, user_store):
    bad = make_corrupt_runs(user_store, example_run)
    at = _app(monkeypatch, user_store)
    errors = _texts(at.error)
    assert bad["bad_json"].name in errors and "corrupt manifest" in errors
    assert bad["bad_parquet"].name in errors and "unreadable parquet" in errors
    assert bad["half"].name in errors and "no cases recorded" in errors
    assert len(at.dataframe[0].value) == 3 + len(example_runs)
    newest_example = max(example_runs, key=lambda r: store.load_manifest(r)["created_utc"])
    assert at.session_state["run_a"] == str(newest_example)  # newest *readable* run
    for page in ("run", "roofline", "stalls", "timeline", "history"):
        _page(at, page)
        assert not at.error
    at.sidebar.selectbox(key="run_a").set_value(str(bad["bad_parquet"])).run()
    _page(at, "roofline")  # the selection persists across pages; the run gets its card
    assert "unreadable parquet" in _texts(at.error) and not at.get("plotly_chart")


def test_cpu_run_pages(monkeypatch, cpu_run, example_run):
    at = _app(monkeypatch, cpu_run.parent, run=cpu_run)
    _page(at, "run")
    assert "CPU run" in _texts(at.warning) and not at.get("plotly_chart")
    assert not at.get("iframe") and "No speedups for a CPU run" in _texts(at.info)
    _page(at, "stalls")
    assert "no ncu metrics" in _texts(at.info)
    _page(at, "timeline")
    assert "no nsys" in _texts(at.info)
    at.sidebar.selectbox(key="run_b").set_value(str(example_run)).run()
    _page(at, "compare")
    assert "device kind differs" in _texts(at.error)
