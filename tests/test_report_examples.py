"""The report of the real runs: the committed H200 runs in runs/examples/ (flash attention fwd,
280 cases; every other example) and a fresh CPU smoke run of experiments/flash.yaml.

A PR comment holds 65,536 characters; the Markdown must stay within report_budget.LIMIT with
the per-case table folded and the implementation x shape pivot on top.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from example_runs import representative

from harness import store

from harness.present import report_budget
from harness.present.report import Report

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "runs" / "examples"
FLASH_FWD = EXAMPLES / "20261122T030028Z-flash-attention-fwd-cbc8"  # real H200 run, 280 cases
IMPLS = ["naive", "fused_mha", "triton_flash", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn",
         "torch_compile"]


def _section(md: str, heading: str) -> str:
    start = md.index(heading)
    end = md.find("\n## ", start + len(heading))
    return md[start:end if end > 0 else None]


def test_flash_fwd_h200_report_fits_a_comment_with_pivot_and_fold():
    rep = Report(FLASH_FWD, store_arg="runs/examples")
    md = rep.markdown()
    assert len(md) <= report_budget.LIMIT == 60_000
    assert "Shortened to fit" not in md  # it fits whole: nothing was cut
    pivot = _section(md, "## Implementation × shape")
    assert "| shape | dtype | " + " | ".join(f"`{i}`" for i in IMPLS) + " |" in pivot
    rows = [ln for ln in pivot.splitlines() if ln.startswith("| B=")]
    assert len(rows) == 40  # 20 shapes x 2 dtypes, one row each
    assert all(ln.count("**") == 2 for ln in rows)  # exactly one best cell per row
    assert "| B=4 N=4096 D=128 causal=false | fp16 | 98.4 | 191 · 1.94x | 465 · 4.72x |" in pivot
    assert "every case: H=16 mode=fwd" in md.splitlines()[2]
    assert "<details><summary>All 280 cases: median, spread, speedup, TFLOP/s" in md
    folded = md.split("</summary>")[1].split("</details>")[0]
    assert folded.count("\n| B=") == 280
    assert md.index("## Implementation × shape") < md.index("<details>")
    verdicts = _section(md, "## Verdicts (ncu-profiled cases)")
    assert verdicts.count("\n- `") == 7 and "**B=4 N=4096 D=128 causal=false fp16**" in verdicts


def test_flash_fwd_html_keeps_every_row():
    rep = Report(FLASH_FWD, store_arg="runs/examples")
    html = rep.html({})
    assert html.count('<tr><td class="l">B=') == 280 + 40 + 7  # cases, pivot, occupancy
    assert "<details><summary>All 280 cases" in html


def test_a_bigger_sweep_is_cut_case_rows_first_and_says_so():
    """The flash run with a limit half its size stands in for a sweep twice as big."""
    rep = Report(FLASH_FWD, store_arg="runs/examples")
    md = rep.markdown(limit=30_000)
    assert len(md) <= 30_000
    m = re.search(r"left out per-case table: rows (\d+)-280 of 280\. `report\.html` keeps "
                  r"everything\.", md)
    assert m, md[-600:]
    kept = int(m.group(1)) - 1
    assert f"<details><summary>The first {kept} of 280 cases (all in report.html)" in md
    assert md.split("</summary>")[1].split("</details>")[0].count("\n| B=") == kept
    assert "## Occupancy" in md and "## Verdicts" in md  # per-kernel detail is cut later
    assert md.rstrip().endswith("</sub>") and md.index("Shortened") > md.index("## Reproduce")


@pytest.mark.parametrize("run", [p.name for p in representative()])
def test_example_reports_fit(run):
    """The newest run of each experiment (and the named ones): that every example still loads
    is test_examples_load's; rendering all of them grew the suite with every committed run."""
    md = Report(EXAMPLES / run, store_arg="runs/examples").markdown()
    assert len(md) <= report_budget.LIMIT
    assert "## Implementation × shape" in md and "<details><summary>" in md


@pytest.mark.slow
def test_cpu_flash_smoke_report_folds_and_groups_skips(cpu_flash_run, tmp_path):
    run, _ = cpu_flash_run
    n = len(store.load_cases(run))
    md = Report(run).markdown()
    assert len(md) <= report_budget.LIMIT
    assert f"<details><summary>All {n} cases: median, spread, max abs err, tol</summary>" in md
    pivot = _section(md, "## Implementation × shape (correctness)")
    rows = [ln for ln in pivot.splitlines() if ln.startswith("| N=")]
    assert len(rows) == 4 and all(ln.count("skipped") == 3 for ln in rows)
    assert all(ln.count("✓") == 4 for ln in rows)
    assert "**" not in "\n".join(rows)  # no "best" on a CPU run: no speed claims
    skips = [ln for ln in md.splitlines() if "(skipped, 4 of 4 cases)" in ln]
    assert [ln.split("`")[1] for ln in skips] == ["sdpa_flash", "sdpa_efficient", "sdpa_cudnn"]
    html = Report(run).html({})
    assert f"<details><summary>All {n} cases" in html


def test_a_config_grid_report_lists_implementations_down_fastest_first():
    """The real H200 dK/dV grid (36 forced configs, one shape): the pivot has a row per
    implementation (the baseline, then fastest first), and the headline names the best few."""
    md = Report(EXAMPLES / "20261123T111718Z-tune-flash-bwd-dkdv-4b29",
                store_arg="runs/examples").markdown()
    pivot = _section(md, "## Implementation × shape")
    assert "| implementation | B=4 H=16 N=4096 D=128 causal=false mode=bwd · fp16 |" in pivot
    rows = [ln for ln in pivot.splitlines() if ln.startswith("| `")]
    assert len(rows) == 39
    assert rows[0] == "| `triton_flash` | 307 |"
    assert rows[1] == "| `sdpa_cudnn` | **520 · 1.69x** |"
    assert rows[2].startswith("| `triton_flash[dkdv.BLOCK_M=64,dkdv.BLOCK_N=64,dkdv.num_warps=4,"
                              "dkdv.num_stages=2]` | 371 · 1.21x")
    rates = [float(r.split("|")[2].strip(" *").split(" ")[0]) for r in rows[1:]]
    assert rates == sorted(rates, reverse=True)
    assert "the highest TFLOP/s in the column" in md
    also = next(ln for ln in md.splitlines() if ln.startswith("- Also, geo-mean"))
    assert "… 29 more …" in also and also.count("**") == 2 * 8


def test_case_rows_cut_early_come_back_when_a_later_cut_makes_room():
    """The per-case rows are cut first, while the hot source lines are still there; once the
    hot lines are dropped too, as many case rows as now fit come back (a config grid with ncu
    on every variant kept none before: its report had no per-case table at all)."""
    def render(ctx):
        cases = ctx["cases"]["rows"] if ctx.get("cases") else []
        hot = ctx.get("hot_lines") or []
        return ("x" * 100 + "c" * (10 * len(cases)) + "h" * (10 * len(hot)) + "|"
                + "|".join(ctx["cut"]))

    ctx = {"cases": {"rows": [[i] for i in range(50)]}, "hot_lines": list(range(80)),
           "occupancy": None, "verdicts": [], "failures": [], "flags": [], "pivot": []}
    md = report_budget.fit(render, ctx, limit=800)
    assert len(md) <= 800 and "h" not in md.split("|")[0]  # the hot lines were dropped
    assert md.split("|")[0].count("c") >= 400  # 40+ case rows came back into the room
    assert "hot source lines" in md
