"""The since-last-run block: what changed since this run's previous comparable run, and why.

    since 20261122T031620Z-softmax-148f (auto): the latest earlier run of softmax on NVIDIA H200 ...
    per implementation, geo-mean of before/now median time (>1: faster now):
      triton: 1.08x over 12 cases: 2 faster, 10 same
    significant changes (noise threshold: floor 3.1% from 4 A/A pairs ...):
      triton N=4096 D=128 fp16: 1.18x faster (significant, p<0.001, CI 1.15–1.21);
          config BLOCK_N 64 → 128; regs 186 → 168; code changed
      … and 3 more

The pair is the manifest's `against` record (analysis.pairing); the marks are those of
analysis.compare (the noise rule: p < 0.01 and the whole CI beyond the pair's noise threshold).
`since_data` returns data; `since_lines`, `print_since`, `since_markdown`, `since_html` and
`since_json` render it, so `show`, the report and the dashboard say the same thing.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness import store
from harness.analysis.diff import change_text
from harness.analysis.evidence import compiled_diff, config_diff  # noqa: F401  (as before)
from harness.analysis.pairing import Against, against_dir
from harness.errors import HarnessError

LIMIT = 8  # significant changes listed; the rest are counted ("… and K more")
MARKED = ("faster", "slower")
@dataclass
class Change:
    key: str  # "triton M=4096 N=8192 fp16"
    impl: str
    mark: str  # faster | slower
    ratio: float  # before / now median time
    ci_low: float
    ci_high: float
    p_value: float
    text: str  # "1.18x faster (significant, p<0.001, CI 1.15–1.21)"
    evidence: list[str] = field(default_factory=list)

    @property
    def line(self) -> str:
        return "; ".join([f"{self.key}: {self.text}", *self.evidence])


@dataclass
class ImplSummary:
    impl: str
    n: int  # paired cases with a ratio (both correct)
    geo_ratio: float | None  # geo-mean of before/now median time; > 1: faster now
    counts: dict[str, int]  # mark -> pairs

    @property
    def text(self) -> str:
        marks = ", ".join(f"{v} {k}" for k, v in self.counts.items() if v)
        if self.geo_ratio is None:
            return f"no correct timed pair ({marks or 'no pairs'})"
        return f"{self.geo_ratio:.2f}x over {self.n} case{'s' if self.n != 1 else ''}: {marks}"


@dataclass
class Since:
    run_id: str
    against: Against
    message: str | None = None  # one line in place of the block (no pair, not comparable)
    floor: str = ""  # "floor 3.1% from 4 A/A pairs (...)"
    n_pairs: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    impls: list[ImplSummary] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    n_more: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"since {self.against.run_id} ({self.against.how})"


# -- data ------------------------------------------------------------------------------------------

def since_data(run_dir: str | Path, *, limit: int = LIMIT,
               known: dict | None = None) -> Since | None:
    """The block for a run from its manifest's `against` record (None: nothing recorded, a run
    made before pairing existed). `known`: {(resolved base dir, allow_incomparable): the
    comparison of that base with this run}, made already (report --against): not made again
    (`_known`)."""
    from harness.analysis.compare import compare_runs

    run_dir = Path(run_dir)
    m = store.load_manifest(run_dir)
    pair = Against.from_dict(m.get("against"))
    if pair is None:
        return None
    if pair.run_id is None:
        return Since(m["run_id"], pair, message=f"since: {pair.why}")
    try:
        prev = against_dir(run_dir, pair)
        allow = pair.how == "explicit"
        c = _known(known, prev, allow)
        if c is None:
            c = compare_runs(prev, run_dir, allow_incomparable=allow)
    except HarnessError as exc:
        return Since(m["run_id"], pair, message=f"since {pair.run_id} ({pair.how}): not "
                                                f"compared: {exc}")
    return _from_comparison(m, store.load_manifest(prev), pair, c, limit)


def _known(known: dict | None, prev: Path, allow: bool):
    """The comparison of `prev` with the run in `known`, made with or without
    allow_incomparable: one made without it found nothing to refuse, so it is the one allowing
    would make. None: not made yet."""
    for (base, allowed), c in (known or {}).items():
        if base == Path(prev).resolve() and (allowed == allow or not allowed):
            return c
    return None


def _from_comparison(m, mp, pair: Against, c, limit: int) -> Since:
    t = c.time
    s = Since(m["run_id"], pair, floor=c.floor.text if c.floor is not None else "",
              n_pairs=len(t), counts={k: int(v) for k, v in t.mark.value_counts().items()})
    for impl, g in t.groupby("impl", sort=False):
        ok = g[g.base_correct & g.cand_correct & (g.ratio > 0)]
        geo = float(np.exp(np.log(ok.ratio.astype(float)).mean())) if len(ok) else None
        counts = g.mark.value_counts()
        s.impls.append(ImplSummary(impl, len(ok), geo, {k: int(counts.get(k, 0)) for k in (
            "faster", "slower", "same", "ambiguous", "missing", "unjudged")
            if counts.get(k, 0)}))
    marked = t[t.mark.isin(MARKED)].copy()
    marked["_effect"] = np.abs(np.log(marked.ratio.astype(float)))
    marked = marked.sort_values("_effect", ascending=False, kind="stable")
    for r in marked.head(limit).to_dict("records"):
        s.changes.append(Change(r["key"], r["impl"], r["mark"], float(r["ratio"]),
                                float(r["ci_low"]), float(r["ci_high"]), float(r["p_value"]),
                                r["text"], list(r["evidence"])))
    s.n_more = max(0, len(marked) - limit)
    if c.problems:  # an explicit pair across machines: said loudly
        s.notes.append(f"INCOMPARABLE RUNS, compared anyway: {'; '.join(c.problems)}")
    s.notes += _notes(mp, m, t) + [n for n in c.notes if not n.startswith("noise threshold")]
    return s


def _notes(mp: dict, m: dict, t: pd.DataFrame) -> list[str]:
    out = []
    ga, gb = ((x.get("env") or {}) for x in (mp, m))
    sha = [(g.get("git_sha") or "?")[:8] + ("*" if g.get("git_dirty") else "") for g in (ga, gb)]
    if ga.get("git_sha") or gb.get("git_sha"):
        out.append(f"git {sha[0]} → {sha[1]}" if sha[0] != sha[1] else
                   f"same git commit {sha[0]}" + (" (* uncommitted changes)" if "*" in sha[0]
                                                  else ""))
    broke = t[t.base_correct & ~t.cand_correct]
    if len(broke):
        out.append(f"now failing correctness: {', '.join(broke.key[:5])}"
                   + (f" … and {len(broke) - 5} more" if len(broke) > 5 else ""))
    fixed = t[~t.base_correct & t.cand_correct]
    if len(fixed):
        out.append(f"now correct: {len(fixed)} case{'s' if len(fixed) != 1 else ''}")
    # said, not hidden: the marks the clock's move, or the shape's unchanged implementations,
    # explain (analysis.compare, analysis.controls)
    clock = t[t.clock_explained.astype(bool)]
    if len(clock):
        out.append(_uncredited("not credited, the SM clock explains", clock, _clock_part))
    shape = t[t.shape_explained.astype(bool)]
    if len(shape):
        out.append(_uncredited("not credited, the same shape's unchanged implementations moved "
                               "as much:", shape, lambda r: change_text(float(r["ratio"]))))
    return out


def _uncredited(lead: str, rows: pd.DataFrame, part) -> str:
    """`<lead> 2 changes: key (part); key (part)` naming at most three, then how many more."""
    n = len(rows)
    keys = [f"{r['key']} ({part(r)})" for r in rows.head(3).to_dict("records")]
    return (f"{lead} {n} change{'s' if n != 1 else ''}: {'; '.join(keys)}"
            + (f" … and {n - 3} more" if n > 3 else ""))


def _clock_part(r: dict) -> str:
    """`1.12x slower, SM clock 1935 → 1718 MHz` for a pair the clock explains."""
    change = change_text(float(r["ratio"]))
    clock = next((e for e in r["evidence"] if e.startswith("SM clock ")), "SM clock moved")
    return f"{change}, {clock}"


# -- renderers -------------------------------------------------------------------------------------

IMPL_HEADER = "per implementation, geo-mean of before/now median time (>1: faster now)"


def change_header(s: Since) -> str:
    """`3 significant changes (noise threshold: ...)` or `no change beyond noise in ...`."""
    if s.changes:
        n = len(s.changes) + s.n_more
        return f"{n} significant change{'s' if n != 1 else ''} (noise threshold: {s.floor})"
    marks = ", ".join(f"{v} {k}" for k, v in s.counts.items())
    return f"no change beyond noise in {s.n_pairs} pairs ({marks}; noise threshold: {s.floor})"


def since_lines(s: Since) -> list[str]:
    """The block as plain text lines (the first is the title)."""
    if s.message:
        return [s.message]
    lines = [f"{s.title}: {s.against.why}", *s.notes, IMPL_HEADER + ":"]
    lines += [f"  {i.impl}: {i.text}" for i in s.impls]
    lines.append(change_header(s) + (":" if s.changes else ""))
    lines += [f"  {c.line}" for c in s.changes]
    if s.n_more:
        lines.append(f"  … and {s.n_more} more")
    return lines


STYLE = {"faster": "green", "slower": "red"}


def print_since(s: Since, console) -> None:
    from rich.markup import escape

    if s.message:
        console.print(escape(s.message), soft_wrap=True)
        return
    console.print(f"[bold]{escape(s.title)}[/]: {escape(s.against.why)}", soft_wrap=True)
    for n in s.notes:
        console.print(f"  [dim]{escape(n)}[/]", soft_wrap=True)
    console.print(f"  [dim]{IMPL_HEADER}[/]")
    for i in s.impls:
        console.print(f"    {escape(i.impl)}: {escape(i.text)}", soft_wrap=True)
    console.print(f"  {escape(change_header(s))}", soft_wrap=True)
    for c in s.changes:
        rest = "; ".join(c.evidence)
        console.print(f"    {escape(c.key)}: [{STYLE[c.mark]}]{escape(c.text)}[/]"
                      + (f"; {escape(rest)}" if rest else ""), soft_wrap=True)
    if s.n_more:
        console.print(f"    … and {s.n_more} more")


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def since_markdown(s: Since, heading: str = "##") -> str:
    """A Markdown section (GitHub-flavoured) for the top of the report."""
    if s.message:
        return f"> {_md(s.message)}\n"
    lines = [f"{heading} Since `{s.against.run_id}` ({s.against.how})", "",
             _md(s.against.why) + ".", ""]
    lines += [f"- {_md(n)}" for n in s.notes] + ([""] if s.notes else [])
    lines += ["| implementation | paired cases | geo-mean before/now | marks |",
              "|---|---:|---:|---|"]
    for i in s.impls:
        geo = "-" if i.geo_ratio is None else f"{i.geo_ratio:.2f}x"
        lines.append(f"| `{i.impl}` | {i.n} | {geo} | "
                     f"{', '.join(f'{v} {k}' for k, v in i.counts.items())} |")
    lines += ["", _md(change_header(s)) + (":" if s.changes else "."), ""]
    for c in s.changes:
        lines.append(f"- {_md(c.key)}: **{_md(c.text)}**"
                     + "".join(f"; {_md(e)}" for e in c.evidence))
    if s.n_more:
        lines.append(f"- … and {s.n_more} more")
    return "\n".join(lines).rstrip() + "\n"


def since_html(s: Since) -> str:
    """The same block as HTML (escaped; the report's table styles), for inside a
    <section class="since">."""
    e = html.escape
    if s.message:
        return f'<p class="note">{e(s.message)}</p>\n'
    out = [f"<h2>Since <code>{e(s.against.run_id)}</code> ({e(s.against.how)})</h2>",
           f"<p>{e(s.against.why)}.</p>"]
    if s.notes:
        out.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in s.notes) + "</ul>")
    out.append('<table><thead><tr><th class="l">implementation</th><th class="r">paired '
               'cases</th><th class="r">geo-mean before/now</th><th class="l">marks</th></tr>'
               "</thead><tbody>")
    for i in s.impls:
        geo = "-" if i.geo_ratio is None else f"{i.geo_ratio:.2f}x"
        marks = ", ".join(f"{v} {k}" for k, v in i.counts.items())
        out.append(f'<tr><td class="l"><code>{e(i.impl)}</code></td><td class="r">{i.n}</td>'
                   f'<td class="r">{geo}</td><td class="l">{e(marks)}</td></tr>')
    out.append("</tbody></table>")
    out.append(f"<p>{e(change_header(s))}{':' if s.changes else '.'}</p>")
    items = [f"<li>{e(c.key)}: <strong>{e(c.text)}</strong>"
             + "".join(f"; {e(x)}" for x in c.evidence) + "</li>" for c in s.changes]
    if s.n_more:
        items.append(f"<li>… and {s.n_more} more</li>")
    if items:
        out.append("<ul>" + "".join(items) + "</ul>")
    return "\n".join(out) + "\n"


def since_json(s: Since | None) -> dict | None:
    if s is None:
        return None
    return {"against": s.against.as_dict(), "title": None if s.message else s.title,
            "message": s.message, "noise_floor": s.floor, "pairs": s.n_pairs,
            "counts": s.counts, "notes": s.notes,
            "implementations": [{"impl": i.impl, "cases": i.n, "geo_ratio": i.geo_ratio,
                                 "counts": i.counts, "text": i.text} for i in s.impls],
            "changes": [{"key": c.key, "impl": c.impl, "mark": c.mark, "ratio": c.ratio,
                         "ci_low": c.ci_low, "ci_high": c.ci_high, "p_value": c.p_value,
                         "text": c.text, "evidence": c.evidence, "line": c.line}
                        for c in s.changes],
            "more": s.n_more, "lines": since_lines(s)}
