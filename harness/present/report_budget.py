"""Fit the Markdown report into one GitHub comment (65,536 characters; we keep a margin).

The report is rendered whole first. When it is longer than the limit, the least important
parts go first, each only as far as needed: the per-case table's rows beyond the first N, then
the per-kernel detail (hot source lines, then the occupancy table), then the profiled cases'
verdicts, the failure lines and the validity flags beyond the first N, and last the pivot's rows
beyond the first N. What was left out is listed at the end of the comment; report.html always
keeps everything.
"""
from __future__ import annotations

from typing import Callable

LIMIT = 60_000  # characters; a GitHub comment holds 65,536

Render = Callable[[dict], str]


def _rows(ctx: dict, key: str) -> list:
    v = ctx.get(key)
    return (v["rows"] if isinstance(v, dict) else v) or []


def _with(ctx: dict, key: str, n: int) -> dict:
    """ctx with only the first n rows (table) or items (list) of ctx[key]."""
    v = ctx[key]
    return {**ctx, key: {**v, "rows": v["rows"][:n]} if isinstance(v, dict) else v[:n]}


def _largest_fit(render: Render, ctx: dict, key: str, limit: int, note: Callable[[int], str]
                 ) -> tuple[dict, int]:
    """(ctx, n) with the most rows of ctx[key] that fit, the cut note included; n may be 0."""
    total = len(_rows(ctx, key))
    lo, hi = 0, total - 1  # the whole list did not fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        trial = _with(ctx, key, mid)
        trial = {**trial, "cut": [*ctx["cut"], note(mid)]}
        if len(render(trial)) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return {**_with(ctx, key, lo), "cut": [*ctx["cut"], note(lo)]}, lo


# In the order they are given up: (context key, section, unit) for the ones cut to their first
# rows, (context key, section) for the ones dropped whole.
FIRST = ("cases", "per-case table", "rows")
DROP = (("hot_lines", "hot source lines (per kernel)"),
        ("occupancy", "occupancy and registers (per kernel)"))
THEN = (("verdicts", "verdicts", "shapes"), ("failures", "failure lines", "lines"),
        ("flags", "validity flags", "flags"), ("pivot", "implementation × shape", "rows"))


def _note(section: str, unit: str, kept: int, n: int) -> str:
    return f"{section}: all {n} {unit}" if kept == 0 else \
        f"{section}: {unit} {kept + 1}-{n} of {n}"


def fit(render: Render, ctx: dict, limit: int = LIMIT) -> str:
    """The Markdown rendered from ctx, shortened (ctx["cut"] says how) to at most `limit`
    characters where the sections above allow it."""
    ctx = {**ctx, "cut": list(ctx.get("cut") or []), "limit": limit}
    md = render(ctx)
    if len(md) <= limit:
        return md
    full_cases = ctx.get("cases")
    steps = [FIRST, *DROP, *THEN]
    for step in steps:
        key = step[0]
        if not _rows(ctx, key):
            continue
        if len(step) == 2:  # drop the whole section
            ctx = {**ctx, key: None if key == "occupancy" else [], "cut": [*ctx["cut"], step[1]]}
        else:
            n = len(_rows(ctx, key))
            ctx, kept = _largest_fit(render, ctx, key, limit,
                                     lambda k, s=step, n=n: _note(s[1], s[2], k, n))
            if key == "cases" and kept == 0:  # no table left: no fold either
                ctx = {**ctx, "cases": None}
        md = render(ctx)
        if len(md) <= limit:
            if key != FIRST[0] and full_cases:  # a later cut made room: case rows back in
                return _regrow_cases(render, ctx, full_cases, limit) or md
            return md
    return md  # still over: everything cuttable is gone (the note says what)


def _regrow_cases(render: Render, ctx: dict, full: dict, limit: int) -> str | None:
    """The Markdown with as many of the per-case table's rows as fit now that later sections
    were cut (they were cut first, while those sections were still there); None: no more fit."""
    n = len(_rows({"cases": full}, "cases"))
    if len(_rows(ctx, "cases")) >= n:
        return None
    cut = [c for c in ctx["cut"] if not c.startswith(FIRST[1] + ":")]
    trial = {**ctx, "cases": full, "cut": cut}
    md = render(trial)
    if len(md) <= limit:
        return md
    grown, kept = _largest_fit(render, trial, "cases", limit,
                               lambda k: _note(FIRST[1], FIRST[2], k, n))
    return render(grown) if kept > len(_rows(ctx, "cases")) else None
