"""The Run page's speedup chart (dashboard.speedup_svg): the report's bars, drawn as SVG.

Read back with an XML parser: every assertion is about what the SVG draws (a bar per correct
candidate case, its height, colour, paleness, label and tooltip), not about its text."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pandas as pd
import pytest

from dashboard.speedup_svg import common_params, nice_ticks, speedup_page, speedup_svg
from harness.analysis.summary import summary_frame
from harness.present import charts

NS = "{http://www.w3.org/2000/svg}"


def _svg(bars: pd.DataFrame, baseline: str = "naive") -> ET.Element:
    text, height = speedup_svg(bars, baseline)
    root = ET.fromstring(text)
    assert root.get("viewBox").split()[-1] == str(height)
    return root


def _bars(root: ET.Element) -> list[ET.Element]:
    return root.findall(f".//{NS}rect[@class='bar']")


def _texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{NS}text")]


def _frame(n_shapes: int, impls: list[str], significant=None) -> pd.DataFrame:
    rows = [{"shape": f"B={2 ** i} H=16 N={1024 * (i + 1)} fp16", "impl": impl,
             "speedup": 0.5 + i + 0.25 * j, "median_ms": 0.1 * (i + 1),
             "significant": None if significant is None else significant(i, j),
             "verdict": "" if significant is None else f"verdict {i} {j}",
             "color": f"#00{j}0{i % 10}0"}
            for i in range(n_shapes) for j, impl in enumerate(impls)]
    return pd.DataFrame(rows)


def test_a_bar_per_case_as_high_as_its_speedup(example_run):
    df = summary_frame(example_run)
    bars, baseline = charts.speedup_bars(df)
    fig = charts.speedup_vs_shape(df)  # the report's figure draws the same bars
    assert list(bars.impl.unique()) == [t.name for t in fig.data]
    for t in fig.data:
        assert list(bars[bars.impl == t.name].speedup) == list(t.y)
    root = _svg(bars, baseline)
    rects = _bars(root)
    assert [r.get("data-impl") for r in rects] == list(bars.impl)
    assert [r.get("fill") for r in rects] == list(bars.color)
    one = root.find(f".//{NS}line[@class='one']")
    base = float(rects[0].get("y")) + float(rects[0].get("height"))
    for r, v in zip(rects, bars.speedup):  # heights scale with the speedup; the 1x line at 1
        assert float(r.get("y")) + float(r.get("height")) == pytest.approx(base, abs=0.02)
        assert float(r.get("height")) / v == pytest.approx(base - float(one.get("y1")), rel=0.01,
                                                           abs=0.1)
    shapes = list(dict.fromkeys(bars["shape"]))
    x = {s: [float(r.get("x")) for r, b in zip(rects, bars["shape"]) if b == s] for s in shapes}
    assert all(max(x[a]) < min(x[b]) for a, b in zip(shapes, shapes[1:]))  # grouped per shape
    subtitle = _texts(root)[1]
    assert f"dashed: {baseline}, the baseline (1x)" in subtitle and "pale:" not in subtitle


def test_labels_while_few_pale_when_not_significant_tooltips():
    few = _frame(4, ["a", "b"], significant=lambda i, j: j == 0)
    root = _svg(few)
    rects = _bars(root)
    assert [r.get("fill-opacity") for r in rects] == [None, "0.35"] * 4
    assert "pale: not a significant difference" in _texts(root)[1]
    labels = [t for t in _texts(root) if re.fullmatch(r"\d+\.\d\dx", t)]
    assert labels == [f"{v:.2f}x" for v in few.speedup]
    tip = rects[3].get("data-tip").split("\n")
    assert tip == ["b", few["shape"][3], "speedup (x) 1.75", "median ms 0.2000", "verdict 1 1"]
    many = _frame(charts.MAX_LABELLED_BARS // 2 + 1, ["a", "b"])
    root = _svg(many)
    assert len(_bars(root)) == len(many) > charts.MAX_LABELLED_BARS
    assert not [t for t in _texts(root) if re.fullmatch(r"\d+\.\d\dx", t)]  # the tooltips say
    assert all(r.get("fill-opacity") is None for r in _bars(root))  # no marks: none pale
    assert "verdict" not in _bars(root)[0].get("data-tip")


def test_shared_parameters_said_once_and_names_escaped():
    bars = _frame(3, ['a<b&"c', "d"])
    root = _svg(bars)
    assert [r.get("data-impl") for r in _bars(root)] == list(bars.impl)  # parsed back whole
    assert 'a<b&"c' in _texts(root)  # the legend
    assert "every shape: H=16 fp16" in _texts(root)[1]
    shape_labels = [t for t in root.iter(f"{NS}text") if t.get("class") == "shape"]
    assert [t.text for t in shape_labels] == ["B=1 N=1024", "B=2 N=2048", "B=4 N=3072"]
    assert [t.find(f"{NS}title").text for t in shape_labels] == list(dict.fromkeys(bars["shape"]))
    page = speedup_page(bars, "naive")
    assert page.startswith("<!doctype html>") and "<svg" in page and "data-tip" in page
    assert page.count("<script>") == 1  # the tooltip


def test_nice_ticks_and_common_params():
    assert nice_ticks(34.2) == [0, 10, 20, 30, 40]
    assert nice_ticks(1.08) == [0, 0.25, 0.5, 0.75, 1.0, 1.25]
    assert nice_ticks(5.0) == [0, 1, 2, 3, 4, 5]
    for top in (0.3, 1.0, 2.7, 13.0, 480.0):
        ticks = nice_ticks(top)
        assert ticks[0] == 0 and ticks[-1] >= top and 2 <= len(ticks) <= 7
    assert common_params(["B=1 H=16 fp16", "B=2 H=16 fp16"]) == ["H=16", "fp16"]
    assert common_params(["B=1 H=16 fp16", "B=2 H=8 bf16"]) == []
    assert common_params(["B=1 H=16 fp16"]) == []  # one shape keeps its whole label
