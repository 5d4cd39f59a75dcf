"""`harness report`: golden Markdown from committed real runs, HTML self-containment, PNGs,
the embedded comparison, and the verb's paths and errors.

Regenerate the golden files after a reviewed change with
    UPDATE_GOLDEN=1 python -m pytest tests/test_report.py -k golden
and read the diff before committing it.
"""
from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness import cli
from harness.errors import HarnessError
from harness.present.report import Report, export_pngs, write_report

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "runs"
GOLDEN = Path(__file__).parent / "fixtures" / "golden"
H200 = "20261122T021915Z-softmax-6059"  # real H200 run (fp16 cases kept), ncu + nsys
CPU = "20261122T023001Z-softmax-7840"  # real CPU run (Triton interpreter)
STORE_ARG = "tests/fixtures/runs"  # as a user at the repo root would type it


def normalise(md: str) -> str:
    return re.sub(r"generated \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "generated <time>", md)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    text = normalise(text)
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            f"golden/{name}", "rendered"))
        pytest.fail(f"report differs from golden/{name} (UPDATE_GOLDEN=1 after review):\n{diff}")


@pytest.mark.parametrize("run_id,golden", [(H200, "report_h200_softmax.md"),
                                           (CPU, "report_cpu_softmax.md")])
def test_markdown_matches_golden(run_id, golden):
    md = Report(FIXTURES / run_id, store_arg=STORE_ARG).markdown()
    check_golden(golden, md)


def test_gpu_markdown_says_what_a_reviewer_needs():
    md = Report(FIXTURES / H200, store_arg=STORE_ARG).markdown()
    assert "geo-mean speedup **1.72x** over `torch` across 6 shapes" in md
    assert "M=8192 N=8192 fp16, 3.76x faster (significant, p<0.001)" in md
    assert "| M=8192 N=8192 fp16 | `triton` | ✓ | 0.0691 | ±1.3% | 100 | **3.76x faster** | " \
           "3,886 | 92% | 60 | 48 | long_scoreboard |" in md
    assert "- no validity flags raised" in md
    assert "| SM clock | 345 MHz at capture, max 1980, application 1980 |" in md
    assert "python -m harness run experiments/softmax.yaml --out runs" in md
    assert not re.search(r"\d%\s+(faster|slower)", md)  # never a bare percentage (rule 8)


def test_validity_flags_are_listed(tmp_path):
    """SYNTHETIC flag on a copy of the real run: the report lists every stored flag."""
    run = tmp_path / H200
    shutil.copytree(FIXTURES / H200, run)
    res = pd.read_parquet(run / "results.parquet")
    res.loc[res.case_id == "triton.M=8192.N=8192.float16", "flags"] = json.dumps(
        ["events-vs-ncu: events median 69.1 us vs ncu 55.0 us (26% apart)"])
    res.to_parquet(run / "results.parquet", index=False)
    md = Report(run, store_arg=STORE_ARG).markdown()
    assert "flag `triton.M=8192.N=8192.float16`: events-vs-ncu: events median 69.1 us" in md
    assert "1 flag raised" in md or "flags raised" in md


def test_cpu_markdown_makes_no_speed_claims():
    md = Report(FIXTURES / CPU, store_arg=STORE_ARG).markdown()
    assert "**CPU run.**" in md and "No speedup claims" in md
    assert "faster" not in md and "GB/s" not in md and "speedup vs" not in md


def synthetic_candidate(tmp_path: Path) -> Path:
    """SYNTHETIC: the real run with triton's samples scaled by 1/1.2 and 40 registers."""
    cand = tmp_path / "20261123T000000Z-softmax-synthetic"
    shutil.copytree(FIXTURES / H200, cand)
    m = json.loads((cand / "manifest.json").read_text())
    (cand / "manifest.json").write_text(json.dumps({**m, "run_id": cand.name}))
    s = pd.read_parquet(cand / "samples.parquet")
    tri = s.case_id.str.startswith("triton.")
    s.loc[tri, "ms"] /= 1.2
    s.to_parquet(cand / "samples.parquet")
    r = pd.read_parquet(cand / "results.parquet")
    r.loc[r.case_id.str.startswith("triton."), "median_ms"] /= 1.2
    r.to_parquet(cand / "results.parquet")
    mt = pd.read_parquet(cand / "metrics.parquet")
    mt.loc[(mt.case_id == "triton.M=8192.N=8192.float16")
           & (mt.name == "registers_per_thread"), "value"] = 40.0
    mt.to_parquet(cand / "metrics.parquet")
    return cand


def test_against_embeds_the_comparison(tmp_path):
    cand = synthetic_candidate(tmp_path)
    rep = Report(cand, against=FIXTURES / H200, store_arg=STORE_ARG)
    md = rep.markdown()
    assert f"## Compared with base `{H200}` (candidate `{cand.name}`)" in md
    assert re.search(r"- triton M=8192 N=8192 fp16: 1\.20x faster \(significant, p<0\.001, "
                     r"CI 1\.\d\d–1\.\d\d\); regs 48 → 40", md)
    assert "18 pairs: 6 faster" in md
    assert "<details><summary>all 18 pairs</summary>" in md
    assert md.index("## Compared with base") < md.index("## Headline")  # the top slot
    html = rep.html({})
    assert "Compared with base" in html and "regs 48 → 40" in html
    assert html.index("<h2>Compared with base") < html.index("<h2>Headline</h2>")


def test_cli_writes_md_and_self_contained_html(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["report", H200, "--store", str(FIXTURES), "--no-png"])
    assert rc == 0
    out = tmp_path / "reports" / H200
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.md"]
    assert "PNG charts not written (--no-png)" in capsys.readouterr().out
    html = (out / "report.html").read_text()
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=\"?http", html)  # works offline
    assert "Plotly.newPlot" in html and html.count('class="chart"') == 3
    assert "plotly.js v" in html  # the library itself is inline


def test_user_errors_are_one_line_exit_2(capsys, tmp_path):
    assert cli.main(["report", H200, "--store", str(FIXTURES), "--against", H200]) == 2
    assert capsys.readouterr().err.strip() == (f"error: report: --against names the same run "
                                               f"({H200})")
    assert cli.main(["report", "no-such-run", "--store", str(FIXTURES)]) == 2
    assert "run 'no-such-run' not found" in capsys.readouterr().err
    with pytest.raises(HarnessError, match="no case in common"):
        Report(FIXTURES / H200, against=FIXTURES / CPU, allow_incomparable=True)


def test_png_export_or_one_line_reason(tmp_path, monkeypatch):
    rep = Report(FIXTURES / H200, store_arg=STORE_ARG)
    figs = rep.figures()
    assert list(figs) == ["speedup_vs_shape", "roofline", "stall_bars"]
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chrome"))
    paths, note = export_pngs(figs, tmp_path)
    assert paths == [] and note.startswith("PNG charts not written: static export failed")
    assert "\n" not in note and not list(tmp_path.glob("*.png"))


@pytest.mark.slow
def test_png_export_with_chromium(tmp_path):
    if not shutil.which("chromium"):
        pytest.skip("no chromium on PATH for kaleido")
    w = write_report(FIXTURES / H200, tmp_path, fmt="both", store_arg=STORE_ARG)
    names = sorted(p.name for p in w.paths)
    assert names == ["report.html", "report.md", "roofline.png", "speedup_vs_shape.png",
                     "stall_bars.png"], w.png_note
    for p in tmp_path.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    assert "`roofline.png` (roofline)" in (tmp_path / "report.md").read_text()


def test_cli_import_does_not_pull_report_dependencies():
    """The GPU worker machine lacks plotly: listing verbs must not import it (nor jinja2/scipy)."""
    code = ("import sys; from harness import cli; cli.build_parser(); "
            "bad = [m for m in ('plotly', 'jinja2', 'scipy', 'kaleido') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_failed_case_gets_no_credit(tmp_path):
    """SYNTHETIC: the real run with one triton case marked as failing correctness."""
    run = tmp_path / H200
    shutil.copytree(FIXTURES / H200, run)
    cid = "triton.M=8192.N=8192.float16"
    c, r = pd.read_parquet(run / "cases.parquet"), pd.read_parquet(run / "results.parquet")
    c.loc[c.case_id == cid, ["status", "error"]] = ["failed", "max abs err 0.5 > tol 0.001"]
    r.loc[r.case_id == cid, "correct"] = False
    r.loc[r.case_id == cid, "speedup_vs_baseline"] = float("nan")
    c.to_parquet(run / "cases.parquet")
    r.to_parquet(run / "results.parquet")
    md = Report(run).markdown()
    row = next(line for line in md.splitlines()
               if line.startswith("| M=8192 N=8192 fp16 | `triton` |"))
    assert row.split(" | ")[2:9] == ["✗ failed", "0.0691", "±1.3%", "100", "-", "-", "-"]
    assert "- `triton.M=8192.N=8192.float16` (failed): max abs err 0.5 > tol 0.001" in md
    assert "Best candidate `torch_compile`" in md  # a candidate failing a case is not best
    assert "`triton` **1.47x** (faster on 3, slower on 2 of 5; **1 not ok**, excluded)" in md
    assert "| M=8192 N=8192 | fp16 | 1,034 | **1,756 · 1.70x** | ✗ failed |" in md  # pivot


# -- layout: the since slot, the pivot, the folded per-case table, the size budget ------------

def test_pivot_is_impl_by_shape_with_the_best_of_each_row_in_bold():
    md = Report(FIXTURES / H200, store_arg=STORE_ARG).markdown()
    assert "| shape | dtype | `torch` | `torch_compile` | `triton` |" in md
    assert "| M=8192 N=8192 | fp16 | 1,034 | 1,756 · 1.70x | **3,886 · 3.76x** |" in md
    assert "| M=4096 N=32768 | fp16 | **2,291** | 2,002 · 0.87x | 2,007 · 0.88x |" in md
    pivot = md[md.index("## Implementation × shape"):md.index("Cell: GB/s")]
    assert pivot.count("\n| M=") == 6 and pivot.count("**") == 12  # one best per row
    # the whole verdict of a profiled case is under Verdicts; its table row keeps the bound
    assert ("- `triton`: memory-bound at 92% of the DRAM roof; top stall long_scoreboard "
            "(7.6 cyc/inst)") in md
    assert "| long_scoreboard | memory-bound |" in md


def test_since_slot_is_rendered_first_and_only_when_filled():
    rep = Report(FIXTURES / H200, store_arg=STORE_ARG)
    assert rep.ctx["since"] == "" and rep.ctx["since_html"] == ""
    plain = rep.markdown()
    rep.ctx["since"] = "## Since `20261121T000000Z-softmax-aaaa` (auto)\n\n- triton: 1.20x faster"
    rep.ctx["since_html"] = "<h2>Since <code>20261121T000000Z-softmax-aaaa</code></h2>"
    md = rep.markdown()
    assert md.index("## Since `20261121T000000Z") < md.index("## Headline")
    assert md.index("> Row softmax") < md.index("## Since")  # after the title block
    assert len(md) - len(plain) == len(rep.ctx["since"]) + 2  # and a blank line
    html = rep.html({})
    assert html.index("<h2>Since <code>") < html.index("<h2>Headline</h2>")
    assert 'class="since"' not in Report(FIXTURES / H200).html({})


def test_per_case_table_is_folded_in_both_documents():
    rep = Report(FIXTURES / H200, store_arg=STORE_ARG)
    md, html = rep.markdown(), rep.html({})
    head, table = md.split("<details><summary>All 18 cases: median, spread, speedup, GB/s, "
                           "% of roof, occupancy, bound</summary>\n\n")
    assert "</details>" in table and table.index("| case | impl |") == 0
    assert table.split("</details>")[0].count("\n| M=") == 18
    assert "<details><summary>All 18 cases" in html and "</table>\n<p class=\"legend\">" in html


def test_budget_cuts_case_rows_first_then_per_kernel_detail():
    rep = Report(FIXTURES / H200, store_arg=STORE_ARG)
    full = rep.markdown()
    md = rep.markdown(limit=len(full) - 1500)
    assert len(md) <= len(full) - 1500
    kept = md.split("</summary>")[1].split("</details>")[0].count("\n| M=")
    assert 0 < kept < 18
    assert f"<details><summary>The first {kept} of 18 cases (all in report.html)" in md
    assert (f"**Shortened to fit a GitHub comment** ({len(full) - 1500:,} characters): left out "
            f"per-case table: rows {kept + 1}-18 of 18. `report.html` keeps everything.") in md
    assert "## Occupancy" in md and "## Implementation × shape" in md
    small = rep.markdown(limit=5000)
    assert len(small) <= 5000
    assert ("left out per-case table: all 18 rows; occupancy and registers (per kernel). "
            "`report.html` keeps everything.") in small  # (this run has no hot source lines)
    assert "## Occupancy" not in small and "<details>" not in small
    assert "## Verdicts" in small and small.count("\n| M=") == 6  # the pivot is whole
    assert "| M=8192 N=8192 | fp16 | 1,034 | 1,756 · 1.70x | **3,886 · 3.76x** |" in small
    tiny = rep.markdown(limit=3000)
    assert len(tiny) <= 3000
    assert re.search(r"verdicts: all 2 shapes; implementation × shape: rows [2-6]-6 of 6\. ", tiny)
    html = rep.html({})  # the HTML keeps everything: cases, pivot and occupancy rows
    assert html.count("<tr><td class=\"l\">M=") == 18 + 6 + 6 and "Occupancy and registers" in html


# -- harness.present.charts: the API the dashboard codes against -------------------------------

def test_chart_builders_on_the_real_run():
    from harness import store
    from harness.present import charts
    from harness.analysis.summary import summary_frame

    run = FIXTURES / H200
    df, metrics = summary_frame(run), store.load_metrics(run)
    cal = json.loads((FIXTURES / ".calibration" / "nvidia-h200.json").read_text())
    sp = charts.speedup_vs_shape(df)
    assert [t.name for t in sp.data] == ["torch_compile", "triton"]
    assert max(sp.data[1].y) == pytest.approx(3.76, abs=0.01)
    assert all(len(t.text) == len(t.y) for t in sp.data)  # 12 bars: each labelled
    many = charts.speedup_vs_shape(pd.concat([df] * 5, ignore_index=True))  # 60 bars
    assert sum(len(t.y) for t in many.data) == 60 > charts.MAX_LABELLED_BARS
    assert all(t.text is None for t in many.data)  # they would overlap: the hover has them
    roof = charts.roofline(df, cal)
    points = [t for t in roof.data if t.mode == "markers"]
    assert sum(len(t.x) for t in points) == 18  # one point per impl x case
    assert any(t.name.startswith("DRAM 4,225 GB/s") for t in roof.data)
    assert any(t.name == "fp16 tensor 644 TFLOP/s" for t in roof.data)
    assert roof.layout.xaxis.type == "log" and roof.layout.yaxis.type == "log"
    counted = charts.roofline(df, cal, "counted")
    assert sum(len(t.x) for t in counted.data if t.mode == "markers") == 6  # profiled only
    bare = charts.roofline(df, None)
    assert "no calibration" in bare.layout.annotations[0].text
    assert not [t for t in bare.data if t.mode == "lines"]
    with pytest.raises(ValueError, match="intensity"):
        charts.roofline(df, cal, "guessed")
    stalls = charts.stall_bars(metrics, df)
    names = [t.name for t in stalls.data]
    assert "selected" not in names and names[0] == "long_scoreboard"
    assert len(stalls.data[0].x) == 6
    occ = charts.occupancy_table(df)
    assert list(occ.columns[:4]) == ["impl", "case", "achieved occupancy %",
                                     "theoretical occupancy %"]
    assert len(occ) == 6 and set(occ["limiter"]) == {"registers"}


def test_report_compares_a_pair_once_where_since_and_against_name_the_same_run(
        tmp_path, monkeypatch, h200_and_a_later_copy):
    """The since block's previous run is usually the one --against names: 1.4 s of a
    report of a 280-case run on a 2-core machine was that comparison made twice."""
    from harness import store
    from harness.analysis import compare, pairing

    before, after = h200_and_a_later_copy("20261123T000000Z-softmax-after")
    pairing.record(after)  # its previous run: `before`
    made = []
    real = compare.compare_runs
    monkeypatch.setattr(compare, "compare_runs", lambda *a, **k: made.append(a) or real(*a, **k))
    w = write_report(after, tmp_path / "rep", fmt="md", against=before, png=False,
                     store_arg=str(tmp_path))
    assert len(made) == 1
    md = (tmp_path / "rep" / "report.md").read_text()
    assert f"## Since `{H200}` (auto)" in md and f"Compared with base `{H200}`" in md
    assert w.paths == [tmp_path / "rep" / "report.md"]
    # a pair named at run time (`run --against`, an ab head) is compared allowing what differs:
    # --against's comparison, which found nothing to refuse, is that one
    m = store.load_manifest(after)
    store.write_manifest(after, {**m, "against": {**m["against"], "how": "explicit"}})
    write_report(after, tmp_path / "rep", fmt="md", against=before, png=False,
                 store_arg=str(tmp_path))
    assert len(made) == 2
    assert f"## Since `{H200}` (explicit)" in (tmp_path / "rep" / "report.md").read_text()


def test_a_report_against_a_run_it_cannot_compare_writes_nothing(tmp_path, monkeypatch):
    """The PNGs (seconds of a headless Chromium) are drawn while the comparisons are made, into
    a folder of their own: a comparison that fails leaves nothing behind."""
    from harness.present import report

    drawn = []

    def fake_pngs(figs, out):  # the PNGs are drawn beside the comparison, into a folder of
        p = Path(out) / "roofline.png"  # their own
        p.write_bytes(b"png")
        drawn.append(p)
        return [p], None

    monkeypatch.setattr(report, "export_pngs", fake_pngs)
    out = tmp_path / "deep" / "rep"
    with pytest.raises(HarnessError, match="no case in common"):
        report.write_report(FIXTURES / H200, out, against=FIXTURES / CPU,
                            allow_incomparable=True, store_arg=str(FIXTURES))
    assert drawn and not drawn[0].exists() and not out.exists()
    # comparable: the PNG drawn meanwhile lands beside the documents
    w = report.write_report(FIXTURES / H200, out, store_arg=str(FIXTURES))
    assert sorted(p.name for p in w.paths) == ["report.html", "report.md", "roofline.png"]
    assert (out / "roofline.png").read_bytes() == b"png"
    # drawn no more (Chromium gone): the older charts go too, as the report says
    monkeypatch.setattr(report, "export_pngs", lambda figs, out: ([], "PNG charts not written"))
    w = report.write_report(FIXTURES / H200, out, store_arg=str(FIXTURES))
    assert w.png_note and not list(out.glob("*.png"))
