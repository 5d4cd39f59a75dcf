"""`python -m harness compare BASE CAND`: is CAND faster than BASE, case by case, and is it real?

    --fail-on-regression 5%   exit 1 when a pair is marked slower (the noise rule) by more than 5 %
    --noise-floor 3%          judge every pair by this fixed floor, not by its measured spread
    --allow-incomparable      compare runs from different GPUs/drivers/clock limits (flagged)
    --format table|json|md

scipy.special is imported inside analysis.stats, only when a comparison runs.
"""
from __future__ import annotations

import argparse
import json
import math

from harness.errors import HarnessError
from harness.values import parse_pct  # noqa: F401 - compare's interface
from harness.store.option import add_store_argument

HELP = "compare two runs case by case (significance test on the raw samples, metric deltas)"

MARK_STYLE = {"faster": "green", "slower": "red", "same": "dim", "ambiguous": "yellow",
              "missing": "magenta", "unjudged": "dim"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", help="base run: run id (under --store) or run directory")
    p.add_argument("cand", help="candidate run: run id (under --store) or run directory")
    add_store_argument(p)
    p.add_argument("--fail-on-regression", metavar="PCT", default=None,
                   help="exit 1 when any pair is significantly slower by more than PCT "
                        "(e.g. 5%%)")
    p.add_argument("--noise-floor", metavar="PCT", default=None,
                   help="judge every pair by this fixed between-run floor (e.g. 3%%) instead "
                        "of its own measured between-process spread")
    p.add_argument("--allow-incomparable", action="store_true",
                   help="compare runs whose GPU, driver, clock limits or device differ "
                        "(the output says so loudly)")
    p.add_argument("--format", choices=("table", "json", "md"), default="table")


def _ms(x) -> str:
    from harness.present.show import fmt_ms

    return fmt_ms(x)


def rows(c) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of the comparison table (Markdown inline syntax in cells)."""
    out = []
    for r in c.time.itertuples():
        text = f"**{r.text}**" if r.mark in ("faster", "slower") else r.text
        out.append([r.key, _ms(r.base_ms), _ms(r.cand_ms), text, "; ".join(r.evidence) or "-"])
    return ["case", "base ms", "candidate ms", "time (candidate vs base)",
            "what changed (config, compiled kernel, profiler, code)"], out


def banner(c) -> str | None:
    if not c.problems:
        return None
    return ("INCOMPARABLE RUNS, compared anyway (--allow-incomparable): "
            + "; ".join(c.problems) + ". Differences may come from the machine, not the code.")


def _cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def notable(c) -> list[str]:
    """Pair sentences worth reading first: significant time changes or metrics that moved."""
    keys = set(c.time.key[c.time.mark.isin(["faster", "slower", "missing"])]) | set(c.metrics.key)
    return [line for line, k in zip(c.pair_lines(), c.time.key) if k in keys]


def to_markdown(c, heading: str = "##") -> str:
    cols, body = rows(c)
    lines = [f"{heading} Compared with base `{c.base_run}` (candidate `{c.cand_run}`)", ""]
    b = banner(c)
    if b:
        lines += ["> [!WARNING]", f"> **{b}**", ""]
    lines += [c.headline + ".", ""]
    lines += [f"- {n}" for n in c.notes] + ([""] if c.notes else [])
    top = notable(c)
    lines += [f"- {_cell(t)}" for t in top] + ([""] if top else [])
    lines += [f"<details><summary>all {len(body)} pairs</summary>", "",
              "| " + " | ".join(cols) + " |",
              "|" + "|".join(["---", "---:", "---:", "---", "---"]) + "|"]
    lines += ["| " + " | ".join(_cell(x) for x in r) + " |" for r in body]
    lines += ["", "</details>", "", legend(c)]
    return "\n".join(lines) + "\n"


def legend(c) -> str:
    noise = c.floor.text if c.floor is not None else "floor 2%"
    return ("time: ratio of medians base/candidate; faster/slower need Mann-Whitney U p < 0.01 "
            "and the whole 95% bootstrap CI beyond ±threshold; same: the CI lies within "
            "±threshold; ambiguous otherwise. A pair's threshold is the larger of its noise "
            "band (its own between-process spread; for runs stored before that, the A/A "
            "floor) and 2x its relative IQR/sqrt(n); a harness ab pair is judged by the 95% CI "
            "of its paired rounds instead; CPU timings are not judged. Here: " + noise + ".")


def to_json(c) -> dict:
    def clean(df):
        return json.loads(df.to_json(orient="records"))

    return {"base_run": c.base_run, "cand_run": c.cand_run, "problems": c.problems,
            "incomparable": bool(c.problems), "cpu": c.cpu, "notes": c.notes,
            "headline": c.headline, "time": clean(c.time), "metrics": clean(c.metrics),
            "noise_floor": c.floor.as_dict() if c.floor is not None else None}


def print_table(c, console) -> None:
    from rich.table import Table

    b = banner(c)
    if b:
        console.print(f"[bold red]{b}[/]", markup=True)
    t = Table(header_style="bold", title=f"{c.cand_run} vs base {c.base_run}")
    cols, body = rows(c)
    for col in cols:
        t.add_column(col, justify="right" if col.endswith("ms") else "left")
    for r, tr in zip(body, c.time.itertuples()):
        style = MARK_STYLE.get(tr.mark, "")
        t.add_row(r[0], r[1], r[2], f"[{style}]{tr.text}[/]", r[4])
    console.print(t)
    for n in c.notes:
        console.print(f"[yellow]note[/] {n}")
    console.print(c.headline, markup=False)
    if b:
        console.print(f"[bold red]{b}[/]")


def main(args, console) -> int:
    from rich.console import Console

    from harness import store
    from harness.analysis.compare import compare_runs, regressions

    threshold = parse_pct(args.fail_on_regression) if args.fail_on_regression else None
    floor = parse_pct(args.noise_floor, "--noise-floor") if args.noise_floor else None
    base = store.resolve_run(args.base, args.store)
    cand = store.resolve_run(args.cand, args.store)
    c = compare_runs(base, cand, allow_incomparable=args.allow_incomparable, noise=floor)
    if args.format == "json":
        print(json.dumps(to_json(c), indent=2))
    elif args.format == "md":
        print(to_markdown(c), end="")
    else:
        print_table(c, console)
    if threshold is not None:
        bad = regressions(c, threshold)
        if len(bad):
            lines = [f"regression: {r.key}: {r.text}" for r in bad.itertuples()]
            lines.append(f"{len(bad)} pair(s) significantly slower by more than "
                         f"{threshold * 100:g}% (--fail-on-regression {args.fail_on_regression}; "
                         f"noise {c.floor.text})")
            # table: with the table; json/md: on stderr, so stdout stays machine-readable
            out = console if args.format == "table" else Console(stderr=True, highlight=False)
            for line in lines:
                out.print(line, style="bold red", markup=False, soft_wrap=True)
            return 1
    return 0
