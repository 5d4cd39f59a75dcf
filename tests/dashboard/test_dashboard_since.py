"""The Run page's "Since the previous run" section (analysis.since), rendered by AppTest.

The run is a copy of the committed GPU example whose triton samples are x0.8 (1.25x faster),
paired explicitly with the example; the expectations come from analysis.since itself.
"""
from __future__ import annotations

from dash_helpers import APP
from streamlit.testing.v1 import AppTest

from dashboard import data
from harness import store
from harness.analysis import pairing
from harness.analysis.since import since_data


def _run_page(monkeypatch, store_root, run) -> AppTest:
    monkeypatch.setenv(data.ENV_STORES, str(store_root))
    monkeypatch.delenv(data.ENV_NO_EXAMPLES, raising=False)
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["run"] = run.name
    at.run()
    at.switch_page("views/run.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_run_page_shows_the_since_block(monkeypatch, example_run, faster_copy):
    store.update_manifest(faster_copy,
                          against=pairing.request(str(example_run), faster_copy.parent).as_dict())
    s = since_data(faster_copy)
    assert s.changes and {c.impl for c in s.changes} == {"triton"}
    at = _run_page(monkeypatch, faster_copy.parent, faster_copy)
    assert "Since the previous run" in [h.value for h in at.subheader]
    text = "\n".join(m.value for m in at.markdown)
    assert f"since {example_run.name} (explicit)" in text.replace("\\", "")
    table = at.dataframe[0].value
    assert list(table.columns) == ["implementation", "paired cases", "geo-mean before/now",
                                   "marks"]
    row = table.set_index("implementation").loc["triton"]
    assert row["geo-mean before/now"] > 1.2 and row["paired cases"] == \
        next(i.n for i in s.impls if i.impl == "triton")
    first = s.changes[0]
    assert f"{first.key}: **{first.text}**" in text.replace("\\", "")
    assert "1.25x faster (significant" in text


def test_a_run_without_a_recorded_pair_says_so(monkeypatch, user_store, example_run):
    at = _run_page(monkeypatch, user_store, example_run)
    assert any("No previous run recorded" in c.value for c in at.caption)
    assert "implementation" not in at.dataframe[0].value.columns  # the summary comes first
