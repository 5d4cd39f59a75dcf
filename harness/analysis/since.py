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
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness import store
from harness.analysis.compare import clock_moved, clock_ratio
from harness.analysis.pairing import Against, against_dir
from harness.errors import HarnessError
from harness.values import finite as _num

LIMIT = 8  # significant changes listed; the rest are counted ("… and K more")
MARKED = ("faster", "slower")
# ncu/nsys metrics worth naming as evidence (canonical names) -> (label, format)
EVIDENCE_METRICS = {
    "block_size": ("block", "{:.0f}"), "grid_size": ("grid", "{:.0f}"),
    "registers_per_thread": ("regs", "{:.0f}"), "shared_mem_per_block_bytes": ("smem", "{:.0f} B"),
    "achieved_occupancy_pct": ("occupancy", "{:.0f}%"),
    "dram_throughput_pct": ("DRAM", "{:.0f}%"), "kernel_count": ("kernels/call", "{:.0f}"),
}
LAUNCH = ("block_size", "grid_size")  # named only when the results carry no `config`
COMPILED = ("registers_per_thread", "shared_mem_per_block_bytes")  # ... no `compiled`
# fields of the results' `compiled` records (one per launched Triton kernel) -> short labels
COMPILED_LABELS = {"registers": "regs", "n_regs": "regs", "spills": "spills", "n_spills": "spills",
                   "shared_bytes": "smem", "shared": "smem", "num_warps": "warps",
                   "num_stages": "stages", "launches": "launches"}


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

def since_data(run_dir: str | Path, *, limit: int = LIMIT) -> Since | None:
    """The block for a run from its manifest's `against` record (None: nothing recorded, a run
    made before pairing existed)."""
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
        c = compare_runs(prev, run_dir, allow_incomparable=pair.how == "explicit")
    except HarnessError as exc:
        return Since(m["run_id"], pair, message=f"since {pair.run_id} ({pair.how}): not "
                                                f"compared: {exc}")
    return _from_comparison(m, store.load_manifest(prev), pair, c, limit)


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
    clock = t[t.clock_explained.astype(bool)]
    if len(clock):  # said, not hidden: the marks the clock's move explains (analysis.compare)
        keys = [f"{r['key']} ({_clock_part(r)})" for r in clock.head(3).to_dict("records")]
        out.append(f"not credited, the SM clock explains {len(clock)} change"
                   f"{'s' if len(clock) != 1 else ''}: {'; '.join(keys)}"
                   + (f" … and {len(clock) - 3} more" if len(clock) > 3 else ""))
    return out


def _clock_part(r: dict) -> str:
    """`1.12x slower, SM clock 1935 → 1718 MHz` for a pair the clock explains."""
    ratio = float(r["ratio"])
    change = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
    clock = next((e for e in r["evidence"] if e.startswith("SM clock ")), "SM clock moved")
    return f"{change}, {clock}"


# -- evidence --------------------------------------------------------------------------------------

def _record(v):
    """A results cell holding a dict (or its JSON) -> dict; a plain value -> itself; None."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, str):
        try:
            parsed = json.loads(v)
        except json.JSONDecodeError:
            return v
        return parsed if parsed is not None else None
    return dict(v) if hasattr(v, "keys") else v


def _flat(d: dict, prefix: str = "") -> dict:
    """{tuner: {field: value}} -> {"tuner.field": value} (a flat dict stays as it is)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(a, b) -> str | None:
    """What changed in the launch configs (None when unknown on a side or equal). Configs are
    the results' JSON {tuner: {field: value}}; per tuner, one or two changed fields are named
    (`config BLOCK_N 64 → 128, num_stages 3 → 2`), more as whole tuples
    (`config (BLOCK_M, BLOCK_N, num_warps, num_stages) (128, 64, 8, 3) → (64, 32, 4, 2)`); the
    tuner's short name leads when the case has several (`dq.num_stages 2 → 3`)."""
    a, b = _record(a), _record(b)
    if a is None or b is None or a == b:
        return None
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return f"config {a} → {b}"
    if not all(isinstance(v, dict) for v in (*a.values(), *b.values())):
        a, b = {"": a}, {"": b}
    tuners = list(dict.fromkeys([*a, *b]))
    parts = []
    for t in tuners:
        x, y = a.get(t) or {}, b.get(t) or {}
        fields = list(dict.fromkeys([*x, *y]))
        moved = [f for f in fields if x.get(f) != y.get(f)]
        if not moved:
            continue
        lead = f"{t.rsplit('.', 1)[-1]}." if len(tuners) > 1 and t else ""
        if len(moved) <= 2:
            parts += [f"{lead}{f} {_v(x.get(f))} → {_v(y.get(f))}" for f in moved]
        else:
            def tup(d):
                return "(" + ", ".join(_v(d.get(f)) for f in fields) + ")"
            parts.append(f"{lead}({', '.join(fields)}) {tup(x)} → {tup(y)}")
    return "config " + ", ".join(parts) if parts else None


def _v(v) -> str:
    return "-" if v is None else str(v)


def autotune_note(rows: list[dict], base_rows: dict, cand_rows: dict, limit: int = 3
                  ) -> str | None:
    """`the autotuner chose differently than in the earlier run in 2 cases: triton N=4096 fp16
    (config BLOCK_SIZE 1024 → 2048); …` for the pairs where a `triton.autotune` kernel picked
    (config_source autotune on a side) another config; None where none did. Said whether or
    not the time moved: an autotuner choosing anew each run is where run-to-run changes of
    unchanged code come from."""
    moved = []
    for row in rows:
        rb, rc = base_rows[row["base_case_id"]], cand_rows[row["cand_case_id"]]
        if "autotune" not in (rb.get("config_source"), rc.get("config_source")):
            continue
        diff = config_diff(rb.get("config"), rc.get("config"))
        if diff:
            moved.append(f"{row['key']} ({diff})")
    if not moved:
        return None
    return (f"the autotuner chose differently than in the earlier run in {len(moved)} "
            f"case{'s' if len(moved) != 1 else ''}: {'; '.join(moved[:limit])}"
            + (f" … and {len(moved) - limit} more" if len(moved) > limit else ""))


def _kernels(v) -> list[dict] | None:
    """The `compiled` record as a list of per-kernel dicts; None when nothing was recorded
    (a CPU run records [])."""
    v = _record(v)
    if isinstance(v, dict):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(k, dict) for k in v):
        return None
    return v


def compiled_diff(a, b) -> list[str] | None:
    """`regs 186 → 168`, `spills 0 → 4`, `smem 16384 → 32768` from the results' `compiled`
    records, kernel by kernel (named when there are several); None when a side has none (the
    ncu metrics stand in)."""
    ka, kb = _kernels(a), _kernels(b)
    if ka is None or kb is None:
        return None
    out = []
    if len(ka) != len(kb):
        out.append(f"compiled kernels {len(ka)} → {len(kb)}")
    if len(ka) == 1 and len(kb) == 1:
        pairs = [("", ka[0], kb[0])]
    else:
        by_name = {str(k.get("kernel")): k for k in kb}
        pairs = [(f"{k.get('kernel')} ", k, by_name[str(k.get("kernel"))]) for k in ka
                 if str(k.get("kernel")) in by_name]
    for prefix, x, y in pairs:
        for k in dict.fromkeys([*x, *y]):
            va, vb = _num(x.get(k)), _num(y.get(k))
            if va is None or vb is None or va == vb or isinstance(x.get(k), bool):
                continue
            out.append(f"{prefix}{COMPILED_LABELS.get(k, k)} {va:g} → {vb:g}")
    return out


def evidence(key: str, rb: dict, rc: dict, metrics: pd.DataFrame) -> list[str]:
    """What explains a change: launch config, registers/spills/shared memory, occupancy, DRAM,
    kernels per call, top stall (the metrics `compare` found moved), and the code hash."""
    out = []
    cfg = config_diff(rb.get("config"), rc.get("config"))
    has_cfg = _record(rb.get("config")) is not None and _record(rc.get("config")) is not None
    if cfg:
        out.append(cfg)
    comp = compiled_diff(rb.get("compiled"), rc.get("compiled"))
    out += comp or []
    moved = {r["name"]: r for r in (metrics[metrics.key == key] if len(metrics) else
                                    metrics).to_dict("records")}
    for name in [*EVIDENCE_METRICS, "top_stall"]:  # launch, compiled, occupancy, DRAM, ...
        r = moved.get(name)
        if r is None or (name in LAUNCH and has_cfg) or (name in COMPILED and comp is not None):
            continue
        if name == "top_stall":
            out.append(f"top stall {r['base'] or '-'} → {r['cand'] or '-'}")
        else:
            label, fmt = EVIDENCE_METRICS[name]
            out.append(f"{label} {fmt.format(r['base'])} → {fmt.format(r['cand'])}")
    if clock_moved(clock_ratio(rb, rc)):
        out.append(f"SM clock {_num(rb.get('sm_clock_timed_mhz')):.0f} → "
                   f"{_num(rc.get('sm_clock_timed_mhz')):.0f} MHz")
    ha, hb = rb.get("code_hash"), rc.get("code_hash")
    if isinstance(ha, str) and isinstance(hb, str):
        out.append("code changed" if ha != hb else "same code")
    return out


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
