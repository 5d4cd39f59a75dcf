"""The Run page's speedup-vs-shape chart: one SVG drawn on the server, shown in a small iframe.

The same bars as the report's chart (`charts.speedup_bars`): grouped per shape, a colour per
candidate, the dashed 1x line of the baseline, pale bars where the speedup is not significant
(the report hatches them), each bar's value on it up to charts.MAX_LABELLED_BARS bars, and a
tooltip per bar (impl, shape, speedup, median, verdict; 20 lines of script in the iframe).
Parameters every shape shares (`H=16 mode=fwd`) are said once in the subtitle, not on every
label.

Why not a charting library: the browser has to load one before it draws. Plotly's bundle
(4.7 MB of JavaScript) held headless Chromium on 2 cores ~0.9 s; with Vega-Lite's (0.8 MB,
loaded when the chart's element arrived) the Run page of a 280-case run drew in 3.72-4.03 s in
the browser test, with this SVG in 3.46-3.63 s (interleaved, one machine; docs/reports.md). An
SVG in an iframe is parsed by the browser's own HTML parser, off React's path (as `st.html` it
is stripped: Streamlit sanitizes it with DOMPurify's HTML-only profile; as Markdown its 60 kB
went through the Markdown pipeline, drawn 0.6-0.8 s after the script's end).
"""
from __future__ import annotations

import math
from html import escape

import pandas as pd

from harness.present import charts

WIDTH = 960           # the viewBox's width (the wide layout's main column); the SVG scales
PLOT_H = 300          # the bars' area
LEFT, RIGHT, TOP = 52, 12, 56
FONT = 10             # axis labels
CHAR_W = 5.6          # a FONT-px character's mean width, for laying out labels
MAX_LABEL_CHARS = 46  # longer shape labels are cut (their <title> and the tooltips keep them)
INK, GRID, MUTED = "#31333f", "#e6e9ef", "#6b6f7b"
PALE = 0.35

PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>
body{margin:0;background:#fff;font-family:"Source Sans Pro","Source Sans 3",sans-serif}
svg{display:block;width:100%;height:auto}
.bar:hover{stroke:#111;stroke-width:1.5}
#tip{position:fixed;display:none;pointer-events:none;white-space:pre;background:#fff;
color:#31333f;border:1px solid #d5d8de;border-radius:4px;padding:4px 8px;font-size:12px;
box-shadow:0 2px 6px rgba(0,0,0,.15)}
</style></head><body>{svg}<div id="tip" role="tooltip"></div><script>
const tip = document.getElementById("tip");
document.querySelector("svg").addEventListener("mousemove", e => {
  const bar = e.target.closest(".bar");
  if (!bar) { tip.style.display = "none"; return; }
  tip.textContent = bar.dataset.tip;
  tip.style.display = "block";
  const x = Math.min(e.clientX + 12, innerWidth - tip.offsetWidth - 4);
  const below = e.clientY + 16 + tip.offsetHeight <= innerHeight;
  tip.style.left = Math.max(0, x) + "px";
  tip.style.top = (below ? e.clientY + 16 : Math.max(0, e.clientY - tip.offsetHeight - 8)) + "px";
});
document.querySelector("svg").addEventListener("mouseleave", () => tip.style.display = "none");
</script></body></html>"""


def nice_ticks(top: float, n: int = 5) -> list[float]:
    """0 and round steps (1, 2, 2.5 or 5 x 10^k) up to at least `top` (> 0)."""
    raw = max(top, 1e-12) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-9))
    return [round(i * step, 12) for i in range(math.ceil(top / step - 1e-9) + 1)]


def common_params(shapes: list[str]) -> list[str]:
    """The words (`H=16`, `fp16`) every one of several shape labels has, in the first's order."""
    if len(shapes) < 2:
        return []
    words = [s.split(" ") for s in shapes]
    rest = [set(w) for w in words[1:]]
    return [w for w in words[0] if all(w in r for r in rest)]


def _cut(text: str, n: int = MAX_LABEL_CHARS) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _legend(impls: list[str], colors: dict[str, str], y0: float) -> tuple[list[str], float]:
    """Swatches and names flowing left to right, wrapping at WIDTH: (svg parts, height)."""
    parts, x, y = [], float(LEFT), y0
    for impl in impls:
        w = 17 + CHAR_W * 1.15 * len(impl) + 20
        if x + w > WIDTH - RIGHT and x > LEFT:
            x, y = float(LEFT), y + 18
        parts.append(f'<g class="legend"><rect x="{x:.1f}" y="{y - 9:.1f}" width="12" '
                     f'height="12" rx="2" fill="{escape(colors[impl])}"/><text x="{x + 17:.1f}" '
                     f'y="{y + 1:.1f}" font-size="11" fill="{INK}">{escape(impl)}</text></g>')
        x += w
    return parts, y - y0 + 18


def speedup_svg(bars: pd.DataFrame, baseline: str) -> tuple[str, int]:
    """(the SVG of `bars`, charts.speedup_bars with at least one row, against `baseline`; its
    height at WIDTH). Each bar is a `rect.bar` whose data-tip is its tooltip's text."""
    shapes = list(dict.fromkeys(bars["shape"]))
    impls = list(dict.fromkeys(bars["impl"]))
    colors = dict(zip(bars["impl"], bars["color"]))
    marks = bool(bars["significant"].notna().any())
    labelled = len(bars) <= charts.MAX_LABELLED_BARS
    common = common_params(shapes)
    label = {s: " ".join(w for w in s.split(" ") if w not in common) for s in shapes}
    ticks = nice_ticks(max(1.0, float(bars["speedup"].max())) * (1.08 if labelled else 1.02))
    top = ticks[-1]
    group = (WIDTH - LEFT - RIGHT) / len(shapes)
    slot = group * 0.8 / len(impls)
    base_y = TOP + PLOT_H

    def y_of(v: float) -> float:
        return base_y - PLOT_H * max(0.0, min(v, top)) / top

    notes = [f"dashed: {baseline}, the baseline (1x)"]
    if marks:
        notes.append("pale: not a significant difference (same or ambiguous)")
    if common:
        notes.append("every shape: " + " ".join(common))
    out = [f'<text x="{LEFT}" y="18" font-size="14" font-weight="600" fill="{INK}">'
           f"{escape(charts.SPEEDUP_TITLE)}</text>",
           f'<text x="{LEFT}" y="36" font-size="11" fill="{MUTED}">'
           f"{escape(' · '.join(notes))}</text>"]
    for t in ticks:  # grid and y axis
        y = y_of(t)
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke="{GRID}"/><text x="{LEFT - 6}" y="{y + 3.5:.1f}" font-size="{FONT}" '
                   f'text-anchor="end" fill="{MUTED}">{t:g}</text>')
    out.append(f'<text transform="translate(14 {TOP + PLOT_H / 2:.0f}) rotate(-90)" '
               f'font-size="11" text-anchor="middle" fill="{INK}">speedup (x)</text>')
    slot_of = {impl: i for i, impl in enumerate(impls)}
    shape_at = {s: i for i, s in enumerate(shapes)}
    for r in bars.itertuples(index=False):
        x = LEFT + group * shape_at[r.shape] + group * 0.1 + slot * slot_of[r.impl]
        y = y_of(r.speedup)
        tip = f"{r.impl}\n{r.shape}\nspeedup (x) {r.speedup:.2f}\nmedian ms {r.median_ms:.4f}"
        if marks and isinstance(r.verdict, str) and r.verdict:
            tip += f"\n{r.verdict}"
        pale = marks and not r.significant
        tip = escape(tip).replace("\n", "&#10;")  # kept by XML parsers too
        out.append(f'<rect class="bar" x="{x:.2f}" y="{y:.2f}" width="{max(slot - 0.6, 0.8):.2f}" '
                   f'height="{base_y - y:.2f}" fill="{escape(r.color)}"'
                   + (f' fill-opacity="{PALE}"' if pale else "")
                   + f' data-impl="{escape(r.impl)}" data-tip="{tip}"/>')
        if labelled:
            out.append(f'<text x="{x + slot / 2:.2f}" y="{y - 3:.1f}" font-size="9" '
                       f'text-anchor="middle" fill="{INK}">{r.speedup:.2f}x</text>')
    one = y_of(1.0)
    out.append(f'<line class="one" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{one:.1f}" '
               f'y2="{one:.1f}" stroke="#555" stroke-dasharray="6 4"/>')
    out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{base_y}" y2="{base_y}" '
               f'stroke="{MUTED}"/>')
    every = max(1, math.ceil((FONT + 2) / group))  # a label per `every` shapes (no overlap)
    longest = max(len(_cut(label[s])) for s in shapes)
    for i, s in enumerate(shapes):
        if i % every:
            continue
        cx = LEFT + group * (i + 0.5)
        out.append(f'<text class="shape" transform="translate({cx + FONT / 3:.1f} {base_y + 6}) '
                   f'rotate(-90)" font-size="{FONT}" text-anchor="end" fill="{INK}">'
                   f"{escape(_cut(label[s]))}<title>{escape(s)}</title></text>")
    legend_y = base_y + 14 + CHAR_W * longest + 16
    legend, legend_h = _legend(impls, colors, legend_y)
    out += legend
    height = math.ceil(legend_y + legend_h)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="speedup-chart" role="img" '
            f'viewBox="0 0 {WIDTH} {height}" preserveAspectRatio="xMinYMin meet" '
            f'aria-label="{escape(charts.SPEEDUP_TITLE)}">' + "".join(out) + "</svg>"), height


def speedup_page(bars: pd.DataFrame, baseline: str) -> str:
    """The HTML page of the chart, for `st.iframe` (sized to its content: the SVG scales to
    the column's width, its height with it)."""
    return PAGE.replace("{svg}", speedup_svg(bars, baseline)[0], 1)
