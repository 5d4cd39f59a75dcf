"""`python -m harness report RUN [--against BASE]`: the run as a PR attachment.

    reports/<run_id>/report.md     GitHub-flavoured Markdown for the PR comment (no images needed)
    reports/<run_id>/report.html   one self-contained file: tables + plotly charts, plotly.js inline
    reports/<run_id>/*.png         static charts (kaleido + Chrome/Chromium), when available

Both documents render the same context (report_context.build) through jinja2 templates in
harness/present/templates/. jinja2, plotly and kaleido are imported inside functions: the CLI
imports this module to list its verbs, also on GPU machines without them.
"""
from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from harness import store
from harness.errors import HarnessError
from harness.store.option import add_store_argument

HELP = "render a run as Markdown (PR comment) and self-contained HTML with charts (+ PNGs)"
TEMPLATES = Path(__file__).parent / "templates"
PNG_SIZE = dict(width=1100, height=560)
CHARTS = {  # file stem -> what it shows
    "speedup_vs_shape": "speedup vs shape",
    "roofline": "roofline",
    "stall_bars": "stall reasons",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run id (under --store) or run directory")
    p.add_argument("--against", metavar="BASE_RUN", default=None,
                   help="embed a comparison with this base run (run id or directory)")
    p.add_argument("--format", choices=("md", "html", "both"), default="both")
    p.add_argument("--out", default=None, help="output directory (default: reports/<run_id>/)")
    add_store_argument(p)
    p.add_argument("--allow-incomparable", action="store_true",
                   help="with --against: compare even if GPU/driver/clock limits differ "
                        "(flagged in the report)")
    p.add_argument("--no-png", action="store_true", help="skip the static PNG charts")


@dataclass
class Written:
    paths: list[Path] = field(default_factory=list)
    png_note: str | None = None  # one line when PNGs were not written


def _env():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=jinja2.select_autoescape(["html.j2"]))
    env.filters["mdcell"] = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    env.filters["inline"] = _inline_html
    return env


def _inline_html(text) -> "str":
    """Escape, then `code` -> <code>, **bold** -> <strong> (the Markdown we put in cells)."""
    from markupsafe import Markup, escape

    s = str(escape(str(text)))
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    s = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", s)
    return Markup(s)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


class Report:
    """Everything loaded once: summary frame with significance marks, calibration, comparison."""

    def __init__(self, run_dir: Path, *, against: Path | None = None, store_arg: str = "runs",
                 store_root: Path | None = None, allow_incomparable: bool = False,
                 pair: bool = True):
        from harness.present import report_context
        from harness.analysis.summary import summary_frame

        self.run_dir = Path(run_dir)
        self.manifest = store.load_manifest(self.run_dir)
        self.calibration = store.run_calibration(self.run_dir,
                                                 *([store_root] if store_root else []))
        self.df = report_context.speedup_marks(summary_frame(self.run_dir),
                                               store.load_samples(self.run_dir))
        self.metrics = store.load_metrics(self.run_dir)
        self.ctx = report_context.build(self.run_dir, self.df, store_arg, self.calibration)
        self.against, self.allow_incomparable = against, allow_incomparable
        self.comparison = None
        self.ctx.update(since="", since_html="")
        if pair:
            self.pair()

    def pair(self) -> None:
        """The comparisons with other runs: --against's, and the since-last-run block at the
        top (one comparison where both name the same run, as `run`'s previous run usually is:
        a 280-case pair takes seconds). `pair=False` leaves them for this call (write_report
        draws the PNGs meanwhile)."""
        known = {}
        if self.against is not None:
            from harness.analysis.compare import compare_runs

            self.comparison = compare_runs(self.against, self.run_dir,
                                           allow_incomparable=self.allow_incomparable)
            known[(Path(self.against).resolve(), self.allow_incomparable)] = self.comparison
        self.ctx.update(since_context(self.run_dir, known))

    # -- charts ---------------------------------------------------------------------------------
    def figures(self) -> dict:
        """stem -> plotly Figure; empty for CPU runs (no performance to plot)."""
        from harness.present import charts

        if self.ctx["cpu"]:
            return {}
        figs = {"speedup_vs_shape": charts.speedup_vs_shape(self.df),
                "roofline": charts.roofline_toggle(self.df, self.calibration)}
        if "dominant_kernel" in self.df and self.df["dominant_kernel"].notna().any():
            figs["stall_bars"] = charts.stall_bars(self.metrics, self.df)
        return figs

    # -- documents ------------------------------------------------------------------------------
    def markdown(self, *, charts: list[tuple[str, str]] | None = None, png_note: str | None = None,
                 generated: str | None = None, limit: int | None = None) -> str:
        """The PR comment: at most `limit` characters (default report_budget.LIMIT), the least
        important parts cut first and named at the end."""
        from harness.present import compare_cli

        from harness.present import report_budget

        comparison = (compare_cli.to_markdown(self.comparison, heading="##")
                      if self.comparison is not None else None)
        template = _env().get_template("report.md.j2")
        ctx = {**self.ctx, "comparison": comparison, "charts": charts, "png_note": png_note,
               "generated": generated or _now()}
        return report_budget.fit(lambda c: template.render(**c), ctx,
                                 report_budget.LIMIT if limit is None else limit)

    def html(self, figs: dict, *, generated: str | None = None) -> str:
        import plotly.io as pio
        from plotly.offline import get_plotlyjs

        from harness.present import compare_cli

        compare = None
        if self.comparison is not None:
            cols, rows = compare_cli.rows(self.comparison)
            compare = {"base_run": self.comparison.base_run, "headline":
                       self.comparison.headline, "banner": compare_cli.banner(self.comparison),
                       "notes": self.comparison.notes,
                       "notable": compare_cli.notable(self.comparison),
                       "legend": compare_cli.legend(self.comparison),
                       "table": {"columns": cols, "rows": rows, "align": list("lrrll")}}
        charts_html = [pio.to_html(f, full_html=False, include_plotlyjs=False,
                                   default_width="100%", default_height="560px",
                                   div_id=f"chart-{stem}", config={"displaylogo": False})
                       for stem, f in figs.items()]
        return _env().get_template("report.html.j2").render(
            **self.ctx, compare=compare, charts_html=charts_html, plotly_js=get_plotlyjs(),
            generated=generated or _now())


def since_context(run_dir: Path, known: dict | None = None) -> dict:
    """`since` (Markdown) and `since_html` (markup, inside <section class="since">): the run's
    since-last-run block (analysis.since; `known`: comparisons made already, as since_data
    takes them); empty when the manifest records no pair (a run made before pairing
    existed)."""
    from markupsafe import Markup

    from harness.analysis.since import since_data, since_html, since_markdown

    s = since_data(run_dir, known=known)
    if s is None:
        return {"since": "", "since_html": ""}
    return {"since": since_markdown(s), "since_html": Markup(since_html(s))}


def export_pngs(figs: dict, out: Path) -> tuple[list[Path], str | None]:
    """Write <stem>.png per figure with kaleido; ([], one-line reason) when it cannot."""
    if not figs:
        return [], None
    try:
        import kaleido  # noqa: F401  (plotly needs kaleido >= 1 for write_images)
        import plotly.io as pio
    except ImportError as exc:
        return [], f"PNG charts not written: kaleido is not installed ({exc.name})"
    paths = [out / f"{stem}.png" for stem in figs]
    statics = []
    for f in figs.values():
        f = type(f)(f)  # a copy without the interactive switch
        f.update_layout(updatemenus=[])
        statics.append(f)
    try:
        pio.write_images(statics, paths, **PNG_SIZE)
    except (RuntimeError, OSError, ValueError) as exc:  # no Chrome/Chromium, or it failed
        for p in paths:
            p.unlink(missing_ok=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return [], (f"PNG charts not written: static export failed ({type(exc).__name__}: "
                    f"{first[:160]}); install chromium or set BROWSER_PATH")
    return paths, None


def write_report(run_dir: Path, out: Path, *, fmt: str = "both", against: Path | None = None,
                 store_arg: str = "runs", store_root: Path | None = None, png: bool = True,
                 allow_incomparable: bool = False, generated: str | None = None) -> Written:
    rep = Report(run_dir, against=against, store_arg=store_arg, store_root=store_root,
                 allow_incomparable=allow_incomparable, pair=False)
    out = Path(out)
    written = Written()
    figs = rep.figures() if fmt in ("html", "both") or png else {}
    pngs: list[Path] = []
    # the PNGs (a headless Chromium: seconds) are drawn, into a folder of their own, while the
    # comparisons are made; a comparison that fails (runs not comparable) leaves nothing. On
    # an error or Ctrl-C the pool's exit waits for the drawing to end, then the folder goes.
    with tempfile.TemporaryDirectory(prefix="report-png-") as tmp, \
            ThreadPoolExecutor(1, thread_name_prefix="report-png") as pool:
        drawn = pool.submit(export_pngs, figs, Path(tmp)) if png and figs else None
        rep.pair()
        out.mkdir(parents=True, exist_ok=True)
        if drawn is not None:
            drew, written.png_note = drawn.result()
            pngs = [Path(shutil.move(p, out / p.name)) for p in drew]
            if written.png_note:  # none drawn: no older charts beside a report that says so
                for stem in figs:
                    (out / f"{stem}.png").unlink(missing_ok=True)
    if not png and figs:
        written.png_note = "PNG charts not written (--no-png)"
    beside = ([("report.html", "self-contained, interactive")] if fmt != "md" else []) + \
        [(p.name, CHARTS[p.stem]) for p in pngs]
    if fmt in ("md", "both"):
        md = rep.markdown(charts=beside, png_note=written.png_note, generated=generated)
        _write(out / "report.md", md)
        written.paths.append(out / "report.md")
    if fmt in ("html", "both"):
        _write(out / "report.html", rep.html(figs, generated=generated))
        written.paths.append(out / "report.html")
    written.paths += pngs
    return written


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main(args, console) -> int:
    run_dir = store.resolve_run(args.run, args.store)
    against = store.resolve_run(args.against, args.store) if args.against else None
    if against is not None and against.resolve() == run_dir.resolve():
        raise HarnessError(f"report: --against names the same run ({run_dir.name})")
    out = Path(args.out) if args.out else Path("reports") / run_dir.name
    w = write_report(run_dir, out, fmt=args.format, against=against,
                     store_arg=str(run_dir.parent), store_root=Path(args.store),
                     png=not args.no_png, allow_incomparable=args.allow_incomparable)
    for p in w.paths:
        console.print(f"wrote {p}", markup=False, highlight=False)
    if w.png_note:
        console.print(w.png_note, style="yellow", markup=False)
    return 0
