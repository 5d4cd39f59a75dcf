"""What a report says, as plain data: headline, tables, flags, environment, how to reproduce.

Both templates (Markdown for the PR comment, HTML with charts) render this same context, so the
two never disagree. Strings may carry `code` and **bold** spans (Markdown inline syntax); the
HTML template converts them. No jinja2/plotly here.

Within-run speedups (candidate vs the run's baseline, same shape and dtype) are tested with
analysis.compare.compare_samples on the raw samples, so the report says "3.76x faster" only
when the difference is significant (DESIGN rule 8).
"""
from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import numpy as np
import pandas as pd

from harness import op_card, store
from harness.analysis.compare import compare_samples
from harness.present.charts import OCCUPANCY_COLUMNS, occupancy_table, shape_label
from harness.present.report_pivot import pivot, varying
from harness.present.show import (_v, config_cells, constant_params, fmt_bytes, fmt_ms,
                          not_ok_groups, spread_pct)
from harness.values import finite as _n

VERDICT_ROOF = re.compile(r"^(memory|compute)-bound at \d+% of the (?:DRAM|compute) roof")
OK_MARK = {"ok": "✓", "failed": "✗ failed", "error": "error", "skipped": "skipped",
           "pending": "pending"}



def _flags(r: dict) -> list[str]:
    f = r.get("flags")
    return json.loads(f) if isinstance(f, str) and f else []


def fixed_params(df: pd.DataFrame) -> dict:
    """Parameters every case shares (said once above the tables, left out of their rows);
    none when the run has a single shape (its rows would have no label left)."""
    if df["params"].apply(lambda p: json.dumps(p, sort_keys=True)).nunique() < 2:
        return {}
    return constant_params(df)


def table(columns: list[str], rows: list[list[str]], align: str | None = None) -> dict:
    """A table for both templates; align: one of l/r/c per column (default: left)."""
    return {"columns": columns, "rows": rows, "align": list(align or "l" * len(columns))}


# -- within-run significance ----------------------------------------------------------------------

def speedup_marks(df: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """Add speedup_mark / speedup_text: each candidate case vs the baseline case of its shape."""
    df = df.copy()
    df["speedup_mark"], df["speedup_text"], df["speedup_ratio"] = None, None, math.nan
    if not len(samples):
        return df
    by_case = {cid: g["ms"].to_numpy(dtype=float) for cid, g in samples.groupby("case_id")}
    key = df["params"].apply(lambda p: json.dumps(p, sort_keys=True)) + "|" + df["dtype"]
    base = {k: r for k, r in zip(key, df.to_dict("records"))
            if r["role"] == "baseline" and r["status"] == "ok"}
    for i, (k, r) in enumerate(zip(key, df.to_dict("records"))):
        b = base.get(k)
        if r["role"] == "baseline" or b is None or r["status"] != "ok":
            continue
        xb, xc = by_case.get(b["case_id"]), by_case.get(r["case_id"])
        if xb is None or xc is None or not len(xb) or not len(xc):
            continue
        d = compare_samples(xb, xc)
        mark, text = d.mark, d.text
        if "cpu_wall" in (b.get("clock"), r.get("clock")):  # interpreter wall-clock
            mark, text = "unjudged", f"CPU: not judged ({d.ratio:.2f}x, interpreter wall-clock)"
        df.iloc[i, df.columns.get_loc("speedup_mark")] = mark
        df.iloc[i, df.columns.get_loc("speedup_text")] = text
        df.iloc[i, df.columns.get_loc("speedup_ratio")] = d.ratio
    return df


def speedup_cell(r: dict) -> str:
    if r["role"] == "baseline":
        return "baseline"
    mark = r.get("speedup_mark")
    # the tested ratio of sample medians (equal to speedup_vs_baseline for a consistent run)
    sp = _n(r.get("speedup_ratio")) if mark else _n(r.get("speedup_vs_baseline"))
    if sp is None:
        return "-"
    if mark == "faster":
        return f"**{sp:.2f}x faster**"
    if mark == "slower":
        return f"{1 / sp:.2f}x slower"
    if mark == "same":
        return f"same ({sp:.2f}x)"
    if mark is None:
        return f"{sp:.2f}x (untested: no samples)"
    if mark == "unjudged":
        return f"{sp:.2f}x (CPU: not judged)"
    return f"{sp:.2f}x, not significant"


# -- sections -------------------------------------------------------------------------------------

def headline(df: pd.DataFrame, baseline: str, cpu: bool) -> list[str]:
    total, ok = len(df), int((df["status"] == "ok").sum())
    if cpu:
        return [f"Correctness: {ok} of {total} cases pass ({df['impl'].nunique()} "
                f"implementations). No speedup claims: interpreter timings on a CPU."]
    lines, ranked = [], []
    for impl, g in df[df.role == "candidate"].groupby("impl", sort=False):
        good = g[(g.status == "ok") & g.speedup_vs_baseline.notna()]
        bad = int((g.status != "ok").sum())
        if not len(good):
            lines.append(f"`{impl}`: no correct, timed case to compare with `{baseline}`"
                         + (f" ({bad} of {len(g)} cases not ok)" if bad else ""))
            continue
        geo = float(np.exp(np.log(good.speedup_vs_baseline.astype(float)).mean()))
        marks = good["speedup_mark"].value_counts()
        counts = ", ".join(f"{w} on {int(marks[m])}" for m, w in (
            ("faster", "significantly faster"), ("slower", "significantly slower"),
            ("same", "the same"), ("ambiguous", "not significant")) if marks.get(m, 0))
        s = (f"geo-mean speedup **{geo:.2f}x** over `{baseline}` across {len(good)} shape"
             f"{'s' if len(good) != 1 else ''} (correct cases only): {counts or 'no samples'}")
        if bad:
            s += f"; **{bad} of {len(g)} cases not ok** (excluded)"
        ranked.append((bad == 0, geo, impl, s, good, len(g)))
    ranked.sort(key=lambda t: (t[0], t[1]), reverse=True)
    out: list[str] = []
    if ranked:
        _, geo, impl, s, good, _n_cases = ranked[0]
        out.append(f"Best candidate `{impl}`: {s}.")
        fast = good[good.speedup_mark == "faster"]
        if len(fast):
            r = fast.loc[fast.speedup_vs_baseline.idxmax()]
            out.append(f"Largest win: {shape_label(r)}, {r.speedup_text}.")
        roof = good["pct_of_roof"].map(_n) if "pct_of_roof" in good else None
        if roof is not None and roof.notna().any():
            r = good.loc[roof.astype(float).idxmax()]
            same = _n(r.get("pct_of_size_copy"))
            same = f", {same:.0f}% of a copy of the same bytes" if same is not None else ""
            out.append(f"Closest to its roof: {shape_label(r)} at {roof.max():.0f}% of the "
                       f"{'DRAM' if r.get('bound') == 'memory' else 'compute'} roof "
                       f"({r.get('bound')}-bound{same}).")
        slow = good[good.speedup_mark == "slower"]
        if len(slow):
            r = slow.loc[slow.speedup_vs_baseline.idxmin()]
            out.append(f"Worst loss: {shape_label(r)}, {r.speedup_text}.")
    # the others: one short clause each, on one line
    others = [_also(impl, geo, good, n) for _, geo, impl, _, good, n in ranked[1:]]
    if len(others) > ALSO_MAX:  # a config grid: the best few and the worst, the table has all
        cut = len(others) - ALSO_MAX
        others = [*others[:ALSO_MAX - 1], f"… {cut} more …", others[-1]]
    if others:
        out.append(f"Also, geo-mean over `{baseline}`: " + "; ".join(others) + ".")
    out += lines
    nflags = sum(len(_flags(r)) for r in df.to_dict("records"))
    if nflags:
        out.append(f"Validity: {nflags} flag{'s' if nflags != 1 else ''} raised on these "
                   f"cases, see Validity before trusting them.")
    if not (df[(df.role == "baseline")].status == "ok").any():
        out.insert(0, f"No speedups: the baseline `{baseline}` has no correct, timed case.")
    return out


ALSO_MAX = 8  # runners-up named in the headline; the rest are counted


def _also(impl: str, geo: float, good: pd.DataFrame, n: int) -> str:
    """`triton_flash` **9.60x** (faster on 40 of 40): a runner-up in one clause."""
    marks = good["speedup_mark"].value_counts()
    counts = ", ".join(f"{w} {int(marks[m])}" for m, w in (
        ("faster", "faster on"), ("slower", "slower on"), ("same", "same on"),
        ("ambiguous", "not significant on")) if marks.get(m, 0))
    bad = n - len(good)
    return (f"`{impl}` **{geo:.2f}x** ({counts or 'no samples'} of {len(good)}"
            + (f"; **{bad} not ok**, excluded" if bad else "") + ")")


def verdicts(df: pd.DataFrame, fixed: dict) -> list[dict]:
    """The verdicts of ncu-profiled cases, grouped by shape: [{shape, lines: [`impl`: text]}].
    (Every case's bound is in the per-case table; a profiled case's verdict says why.)"""
    prof = df[df["ncu_duration_us"].notna()] if "ncu_duration_us" in df else df.iloc[0:0]
    groups: dict[str, list[str]] = {}
    for r in prof.to_dict("records"):
        v = r.get("verdict")
        if r["status"] == "ok" and isinstance(v, str) and v:
            shape = (varying(r["params"], fixed) + f" {_dt(r['dtype'])}").strip()
            groups.setdefault(shape, []).append(f"`{r['impl']}`: {v}")
    return [{"shape": k, "lines": v} for k, v in groups.items()]


def correctness_table(df: pd.DataFrame) -> dict:
    rows = []
    for impl, g in df.groupby("impl", sort=False):
        ratio = [(_n(a) or 0) / _n(t) for a, t in zip(g.get("max_abs_err", []), g.get("tol", []))
                 if _n(t)]
        st = g["status"].value_counts()
        rows.append([f"`{impl}`", g["role"].iloc[0], str(int(st.get("ok", 0))),
                     str(int(st.get("failed", 0))), str(int(st.get("error", 0))),
                     str(int(st.get("skipped", 0)) + int(st.get("pending", 0))),
                     f"{max(ratio):.2f}" if ratio else "-"])
    return table(["impl", "role", "pass", "fail", "error", "skipped", "worst err / tol"], rows,
                 "llrrrrr")


def failures(df: pd.DataFrame) -> list[str]:
    """One line per case that did not pass; skipped cases one per (impl, reason) with a count."""
    return [f"`{g['case_id']}` ({g['status']}): {g['error']}" if g["case_id"] else
            f"`{g['impl']}` (skipped, {g['count']} of {g['total']} cases): {g['error']}"
            for g in not_ok_groups(df)]


def cases_table(df: pd.DataFrame, cpu: bool, primary: str, baseline: str,
                fixed: dict | None = None, manifest: dict | None = None) -> dict:
    has_ncu = "achieved_occupancy_pct" in df and df["achieved_occupancy_pct"].notna().any()
    has_roof = "pct_of_roof" in df and df["pct_of_roof"].notna().any()
    has_same = "pct_of_size_copy" in df and df["pct_of_size_copy"].notna().any()
    cols, align = ["case", "impl", "ok", "median ms", "spread", "n"], "lllrrr"
    if cpu:
        cols, align = cols + ["max abs err", "tol"], align + "rr"
    else:
        cols += [f"speedup vs {baseline}", "TFLOP/s" if primary == "tflops" else "GB/s"]
        align += "rr"
        if has_roof:
            cols, align = cols + ["% of roof"], align + "r"
        if has_same:
            cols, align = cols + ["% of same-size copy"], align + "r"
        if has_ncu:
            cols, align = cols + ["occ %", "regs", "top stall"], align + "rrl"
        cols, align = cols + ["verdict"], align + "l"
    records = df.to_dict("records")
    configs = config_cells(records, manifest)  # the launch config, where it varies
    if configs is not None:
        cols, align = cols + [configs[0]], align + "l"
    rows = []
    for i, r in enumerate(records):
        cells = [(varying(r["params"], fixed or {}) + f" {_dt(r['dtype'])}").strip(),
                 f"`{r['impl']}`",
                 OK_MARK.get(r["status"], r["status"]), fmt_ms(r.get("median_ms")),
                 spread_pct(r), "-" if _n(r.get("n_samples")) is None
                 else f"{_n(r['n_samples']):.0f}"]
        if cpu:
            cells += [_g(r.get("max_abs_err")), _g(r.get("tol"))]
        else:  # a case that is not ok gets no throughput, roof or verdict: nothing to credit
            ok = r["status"] == "ok"
            thr = _n(r.get("tflops" if primary == "tflops" else "gbps")) if ok else None
            cells += [speedup_cell(r), "-" if thr is None else
                      (f"{thr:,.1f}" if primary == "tflops" or thr < 100 else f"{thr:,.0f}")]
            if has_roof:
                pr = _n(r.get("pct_of_roof")) if ok else None
                cells.append("-" if pr is None else f"{pr:.0f}%")
            if has_same:
                ps = _n(r.get("pct_of_size_copy")) if ok else None
                cells.append("-" if ps is None else f"{ps:.0f}%")
            if has_ncu:
                occ, regs = _n(r.get("achieved_occupancy_pct")), _n(r.get("registers_per_thread"))
                cells += ["-" if occ is None else f"{occ:.0f}",
                          "-" if regs is None else f"{regs:.0f}",
                          r["top_stall"] if isinstance(r.get("top_stall"), str) else "-"]
            v = r["verdict"] if isinstance(r.get("verdict"), str) and ok else "-"
            v = v.split(";")[0]  # the bound; a profiled case's whole verdict is under Verdicts
            if has_roof:  # the % is in its own column: "memory-bound at 92% of the DRAM roof"
                v = VERDICT_ROOF.sub(r"\1-bound", v)
            cells.append(v)
        if configs is not None:
            cells.append(configs[1][i])
        rows.append(cells)
    return table(cols, rows, align)


def _dt(dtype: str) -> str:
    from harness.experiment.spec import DTYPE_SHORT

    return DTYPE_SHORT.get(dtype, dtype)


def _g(x) -> str:
    v = _n(x)
    return "-" if v is None else f"{v:.2g}"


def occupancy_rows(df: pd.DataFrame) -> dict | None:
    occ = occupancy_table(df)
    if not len(occ):
        return None
    labels = list(OCCUPANCY_COLUMNS.values())
    rows = []
    for r in occ.to_dict("records"):
        cells = [r["case"], f"`{r['impl']}`"]
        for lab in labels:
            v = r[lab]
            if lab == "limiter":
                cells.append(v if isinstance(v, str) else "-")
            elif lab.startswith("shared mem"):
                cells.append(fmt_bytes(v))
            elif lab == "waves/SM":
                cells.append("-" if _n(v) is None else f"{v:.2f}")
            else:
                cells.append("-" if _n(v) is None else f"{v:,.0f}")
        rows.append(cells)
    cols = ["case", "impl", "achieved occ %", "theoretical occ %", "limiter", "regs/thread",
            "smem/block", "block", "grid", "waves/SM"]
    return table(cols, rows, "llrrlrrrrr")


def flag_lines(df: pd.DataFrame) -> list[str]:
    return [f"`{r['case_id']}`: {f}" for r in df.to_dict("records") for f in _flags(r)]


def pass_lines(m: dict) -> list[str]:
    out = []
    walls = m.get("profiler_wall_s") or {}
    for name, state in (m.get("passes") or {}).items():
        w = walls.get(name) or {}
        extra = f" ({w['cases']} cases, {w['wall_s']:.0f} s)" if w.get("cases") else ""
        out.append(f"{name}: {state}{extra}")
    return out


def env_table(m: dict) -> dict:
    env = m.get("env") or {}
    rows = []

    def add(k, v):
        if v not in (None, "", "None MHz"):
            rows.append([k, str(v)])

    if m.get("device") == "cuda":
        mem = _n(env.get("gpu_memory_mib"))
        add("GPU", f"{env.get('gpu_name')} (x{env.get('gpu_count') or 1}"
                   + (f", {mem / 1024:.0f} GiB)" if mem else ")"))
        add("driver / CUDA", f"{env.get('driver') or '?'} / {env.get('cuda') or '?'}")
        add("SM clock", _clock(env.get("sm_clock_mhz"), env.get("sm_clock_max_mhz"),
                               env.get("app_sm_clock_mhz")))
        add("memory clock", _clock(env.get("mem_clock_mhz"), env.get("mem_clock_max_mhz")))
        pw = _n(env.get("power_limit_w"))
        t = _n(env.get("gpu_temp_c"))
        add("power / state", ", ".join(s for s in (
            f"limit {pw:.0f} W" if pw else "", env.get("pstate") or "",
            f"{t:.0f} °C at start" if t is not None else "") if s))
    else:
        add("device", f"CPU ({env.get('cpu') or 'unknown'}): Triton interpreter")
    add("torch / triton / python", f"{env.get('torch')} / {env.get('triton')} / "
                                   f"{env.get('python')}")
    sha = env.get("git_sha")
    add("git", f"`{sha}`" + (" (dirty: uncommitted changes)" if env.get("git_dirty") else
                              " (clean)") if sha else "not recorded")
    add("host", f"{env.get('hostname')} ({env.get('cpu')})")
    add("run", f"`{m['run_id']}`, {m.get('status')}, started {_utc(m.get('created_utc'))}"
               + (f", finished {_utc(m.get('finished_utc'))}" if m.get("finished_utc") else ""))
    add("spec hash / seed", f"{m.get('spec_hash')} / {m.get('seed')}")
    return table(["", ""], rows)


def _clock(now, mx=None, app=None) -> str | None:
    now, mx, app = _n(now), _n(mx), _n(app)
    if now is None and mx is None:
        return None
    parts = [f"{now:.0f} MHz at capture" if now is not None else "not recorded"]
    if mx is not None:
        parts.append(f"max {mx:.0f}")
    if app is not None:
        parts.append(f"application {app:.0f}")
    return ", ".join(parts)


def _utc(ts: str | None) -> str:
    return ts[:19].replace("T", " ") + " UTC" if ts else "?"


def reproduce(m: dict, store_arg: str) -> list[str]:
    cmd = m.get("command") or []
    lines = []
    sha = (m.get("env") or {}).get("git_sha")
    if sha:
        lines.append(f"git checkout {sha}" + ("   # the run had uncommitted changes"
                                              if (m.get("env") or {}).get("git_dirty") else ""))
    if isinstance(cmd, str):
        lines.append(cmd)
    else:
        lines.append(shlex.join(cmd) if cmd else "# the run's manifest has no command line")
    lines.append(f"python -m harness report {m['run_id']} --store {store_arg}")
    return lines


def hot_lines(run_dir: Path, n: int = 5) -> list[dict]:
    """Per profiled kernel with source lines (ncu SourceCounters): its n most sampled lines."""
    from harness.profilers.ncu_source import mix_text, top_lines

    lines = store.load_source_lines(run_dir)
    if lines.empty:
        return []
    out = []
    for (case_id, kernel), g in top_lines(lines, n).groupby(["case_id", "kernel"], sort=False):
        rows = [[f"`{Path(str(r['file'])).name}:{int(r['line'])}`", f"{r['share'] * 100:.1f} %",
                 mix_text(r["stall_mix"], r["samples"]),
                 ("[triton] " if r["library"] else "") + f"`{str(r['text']).strip()}`"]
                for r in g.to_dict("records")]
        out.append({"case": case_id, "kernel": kernel,
                    "table": table(["line", "share", "top stalls", "source"], rows, "lrll")})
    return out


def candidate_labels(exp: dict) -> list[str]:
    """The experiment's candidates for the header line: names as given (a named config by its
    name), a variant grid as `impl[k1,k2] x N` rather than N names."""
    out = [c if isinstance(c, str) else str(c.get("name")) for c in exp.get("candidates") or []]
    for impl, grid in (exp.get("variants") or {}).items():
        n = int(np.prod([len(v) if isinstance(v, list) else 1 for v in grid.values()]))
        out.append(f"{impl}[{','.join(grid)}] x{n}")
    return out


def build(run_dir: Path, df: pd.DataFrame, store_arg: str, calibration: dict | None) -> dict:
    """The whole context minus charts and the comparison (report.py adds those)."""
    m = store.load_manifest(run_dir)
    exp = m["experiment"]
    cpu = m.get("device") != "cuda"
    env = m.get("env") or {}
    primary = op_card.primary(m)
    where = env.get("gpu_name") if not cpu else "CPU (Triton interpreter)"
    notes = []
    if not cpu and calibration is None:
        notes.append(f"no calibration for {env.get('gpu_name')}: no % of roof and no roofs in "
                     f"the roofline (run `python -m harness calibrate` on that GPU)")
    fixed = fixed_params(df)
    return {
        # The since-last-run / --against block, rendered first when not empty: Markdown for
        # report.md and markup for report.html (harness.analysis.since fills them).
        "since": "", "since_html": "",
        "title": f"{exp['name']} on {where}",
        "run_id": m["run_id"], "op": exp["op"], "baseline": exp.get("baseline"),
        "candidates": candidate_labels(exp), "n_cases": len(df),
        "status": m.get("status"), "description": exp.get("description") or "",
        "cpu": cpu, "primary": primary,
        "headline": headline(df, exp.get("baseline"), cpu),
        "correctness": correctness_table(df), "failures": failures(df),
        "tol_factor": (exp.get("correctness") or {}).get("tol_factor"),
        "fixed": " ".join(f"{k}={_v(v)}" for k, v in fixed.items()),
        "pivot": pivot(df, cpu=cpu, primary=primary, fixed=fixed),
        "verdicts": verdicts(df, fixed),
        "cases": cases_table(df, cpu, primary, exp.get("baseline"), fixed, m),
        "cut": [],  # what report_budget left out of the Markdown to fit a PR comment
        "occupancy": occupancy_rows(df), "flags": flag_lines(df),
        "n_flags": len(flag_lines(df)), "passes": pass_lines(m),
        "hot_lines": hot_lines(run_dir),
        "notes": notes, "env": env_table(m), "reproduce": reproduce(m, store_arg),
        "timing_clock": ", ".join(str(c) for c in df["clock"].dropna().unique())
        if "clock" in df else "",
    }
