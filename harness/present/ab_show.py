"""`harness ab`'s main and what it prints: the paired verdict per case, and with --ncu both
versions' counters and hottest source lines side by side. The measuring is
harness.execute.ab's (its parser too)."""
from __future__ import annotations

import math
from pathlib import Path

from harness import store
from harness.execute.ab import HELP, add_arguments  # noqa: F401 - the verb's parser

STYLE = {"faster": "green", "slower": "red", "same": "dim", "ambiguous": "yellow",
         "missing": "magenta", "unjudged": "dim"}
HOT = 3  # source lines per version


def _pct(x) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * 100:.2g}%"


def main(a, console) -> int:
    from harness.analysis.paired import MIN_EFFECT
    from harness.execute.ab import measure
    from harness.values import parse_pct

    fail = parse_pct(a.fail_on_regression) if a.fail_on_regression else None
    min_effect = parse_pct(a.min_effect, "--min-effect") if a.min_effect else MIN_EFFECT
    pair = measure(a, console, min_effect)
    if pair is None:
        return 130
    c = render(pair.base_dir, pair.head_dir, console,
               ncu=a.ncu is not None and pair.device == "cuda")
    if fail is not None and c is not None:
        from harness.analysis.compare import regressions

        bad = regressions(c, fail)
        if len(bad):
            for r in bad.itertuples():
                console.print(f"regression: {r.key}: {r.text}", style="bold red", markup=False,
                              soft_wrap=True)
            console.print(f"{len(bad)} case(s) slower by more than {fail * 100:g}% "
                          f"(--fail-on-regression {a.fail_on_regression})", style="bold red",
                          markup=False)
            return 1
    return 0


def render(base_dir: Path, head_dir: Path, console, ncu: bool = False):
    """Print the pair's table and notes; returns the Comparison (None when not comparable)."""
    from rich.markup import escape
    from rich.table import Table

    from harness.analysis.compare import compare_runs
    from harness.errors import HarnessError
    from harness.present.show import fmt_ms

    mb, mh = store.load_manifest(base_dir), store.load_manifest(head_dir)
    try:
        c = compare_runs(base_dir, head_dir)
    except HarnessError as exc:
        console.print(f"ab: nothing to compare: {exc}", markup=False)
        return None
    why = {r["case_id"]: r.get("error") for r in store.read_parts(head_dir, "ab")
           if r.get("status") != "ok"}
    ab = mh.get("ab") or {}
    t = Table(header_style="bold", title=f"head ({ab.get('rev')}) vs base ({ab.get('base_rev')}"
                                         f" = {str(ab.get('base_sha'))[:12]})")
    for col in ("case", "base ms", "head ms", "head/base (95% CI)", "MDE", "verdict"):
        t.add_column(col, justify="right" if col in ("base ms", "head ms", "MDE") else "left")
    for r in c.time.itertuples():
        if r.mark == "missing":
            verdict = f"not timed: {why.get(r.cand_case_id) or r.text}"
            ratio = "-"
        else:
            verdict = r.text
            ratio = (f"{1 / r.ratio:.3f} ({1 / r.ci_high:.3f}–{1 / r.ci_low:.3f})"
                     if r.ratio > 0 and r.ci_low > 0 else "-")
        t.add_row(escape(r.key), fmt_ms(r.base_ms), fmt_ms(r.cand_ms), ratio, _pct(r.mde),
                  f"[{STYLE.get(r.mark, '')}]{escape(verdict)}[/]")
    console.print(t)
    for n in c.notes:
        console.print(f"[yellow]note[/] {escape(n)}", soft_wrap=True)
    console.print(c.headline, markup=False, soft_wrap=True)
    if ncu:
        side_by_side(base_dir, head_dir, c, console)
    walls = mh.get("pass_wall_s") or {}
    if walls:
        console.print("wall: " + " · ".join(f"{k} {v:.1f} s" for k, v in walls.items()))
    console.print(f"stored: base run {mb['run_id']}, head run {mh['run_id']} (show, compare, "
                  f"report --against and the dashboard read them: python -m harness compare "
                  f"{mb['run_id']} {mh['run_id']})", markup=False, soft_wrap=True)
    return c


def side_by_side(base_dir: Path, head_dir: Path, c, console) -> None:
    """ncu's counters of both versions of each profiled case, then their hottest lines."""
    from harness.analysis.compare import COMPARED_METRICS, describe_metric
    from harness.analysis.summary import summary_frame
    from harness.profilers.ncu_source import top_lines
    from harness.present.show import hot_line_text

    frames = [summary_frame(d).set_index("case_id") for d in (base_dir, head_dir)]
    lines = [store.load_source_lines(d) for d in (base_dir, head_dir)]
    shown = 0
    for r in c.time.itertuples():
        rows = [f.loc[cid].to_dict() if cid in f.index else {} for f, cid in
                zip(frames, (r.base_case_id, r.cand_case_id))]
        if not any(_num(x.get("ncu_duration_us")) for x in rows):
            continue
        shown += 1
        parts = []
        for col, name, _, _, _, _ in COMPARED_METRICS:
            a, b = (_num(x.get(col)) for x in rows)
            if a is not None and b is not None:
                parts.append(describe_metric(name, a, b))
        sa, sb = (x.get("top_stall") for x in rows)
        if isinstance(sa, str) or isinstance(sb, str):
            parts.append(describe_metric("top_stall", sa, sb))
        console.print(f"[bold]ncu[/] {r.key} (base → head): " + "; ".join(parts),
                      soft_wrap=True, markup=True)
        for label, table, cid in (("base", lines[0], r.base_case_id),
                                  ("head", lines[1], r.cand_case_id)):
            hot = top_lines(table[table.case_id == cid], HOT) if len(table) else table
            for h in hot.to_dict("records"):
                console.print(f"  {label} · {h['kernel']}: {hot_line_text(h)}", markup=False,
                              soft_wrap=True, highlight=False)
    if not shown:
        console.print("ncu: no profiled case (see each run's passes)")


def _num(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None
