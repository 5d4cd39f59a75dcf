"""The summary of a stored run: a rich table for people, JSON for programs (`harness show`)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness import op_card, store
from harness.analysis.summary import summary_frame
from harness.experiment.spec import DTYPE_SHORT
from harness.values import finite as _n

MARK = {"ok": "[green]✓[/]", "failed": "[red]✗[/]", "error": "[red]error[/]",
        "skipped": "[dim]skip[/]", "pending": "[dim]…[/]",
        "timeout": "[red]timeout[/]"}



def fmt_ms(x) -> str:
    v = _n(x)
    if v is None:
        return "-"
    return f"{v:.4f}" if v < 0.1 else f"{v:.3f}" if v < 10 else f"{v:.1f}"


def fmt_bytes(x) -> str:
    v = _n(x)
    if v is None:
        return "-"
    for unit, f in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if v >= f:
            return f"{v / f:.2f} {unit}"
    return f"{v:.0f} B"


def spread_pct(row) -> str:
    med, lo, hi = _n(row.get("median_ms")), _n(row.get("p20_ms")), _n(row.get("p80_ms"))
    if not med or lo is None or hi is None:
        return "-"
    return f"±{(hi - lo) / 2 / med * 100:.1f}%"


def constant_params(df: pd.DataFrame) -> dict:
    """Parameters with one value across all cases of a run (shown once, not per row)."""
    if len(df) < 2:
        return {}
    rows = list(df["params"])
    first = rows[0]
    return {k: v for k, v in first.items() if all(r.get(k) == v for r in rows[1:])}


def _s(x) -> str:
    return x if isinstance(x, str) and x else "-"


def _v(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def parse_config(raw) -> dict[str, dict]:
    """A results `config` cell -> {tuner: {field: value}} ({} when none was recorded)."""
    if isinstance(raw, str) and raw:
        try:
            v = json.loads(raw)
        except json.JSONDecodeError:
            return {}
        return v if isinstance(v, dict) else {}
    return raw if isinstance(raw, dict) else {}


def tuner_prefixes(rows: list[dict], manifest: dict | None = None) -> dict[str, str]:
    """Tuner name -> the prefix its fields have as tunables of the rows' impls ("" for an
    impl's unprefixed Tuner), so that shown names match the YAML (`dq.BLOCK_M`); from the
    run's op card (harness.op_card), else the registry."""
    from harness import op_card

    out: dict[str, str] = {}
    for op_name, impl in {(r.get("op"), r.get("base_impl") or r.get("impl")) for r in rows}:
        # an op or impl no longer registered: tuner names as recorded
        for name, prefix in (op_card.tuners(manifest, op_name, impl) or {}).items():
            out.setdefault(name, prefix)
    return out


def flat_config(cfg: dict[str, dict], many_tuners: bool,
                prefixes: dict[str, str] | None = None) -> dict[str, object]:
    """{tuner: {field: v}} -> {field: v}; with several tuners in the run, fields are prefixed
    as the impl's tunables are (`prefixes`), else by the tuner name's last part."""
    out = {}
    for tuner, fields in cfg.items():
        prefix = (prefixes or {}).get(tuner, tuner.split(".")[-1]) if many_tuners else ""
        for k, v in (fields or {}).items():
            out[f"{prefix}.{k}" if prefix else k] = v
    return out


def fold_repeats(cfg: dict[str, dict]) -> dict[str, dict]:
    """A tuner picked again in one case (`tuner#2`: a second GEMM of the MLP) shows only the
    fields where its pick differs from the first; an identical repeat is left out."""
    out = {}
    for name, fields in cfg.items():
        base, sep, _ = name.partition("#")
        first = cfg.get(base) if sep else None
        if first is None or not isinstance(fields, dict):
            out[name] = fields
            continue
        diff = {k: v for k, v in fields.items() if first.get(k) != v}
        if diff:
            out[name] = diff
    return out


def config_cells(rows: list[dict], manifest: dict | None = None) -> tuple[str, list[str]] | None:
    """(header, cells): per row, the launch-config fields that vary across the run, and the
    source when not tuned. When every configured row has the same fields the header names them
    and a cell is `64/32/4 (forced)`; else a cell is `BLOCK_M=64 dq.BLOCK_N=32`. None when no
    field varies (the column is left out)."""
    cfgs = [fold_repeats(parse_config(r.get("config"))) for r in rows]
    many = len({t for c in cfgs for t in c}) > 1
    prefixes = tuner_prefixes(rows, manifest) if many else {}
    flats = [flat_config(c, many, prefixes) for c in cfgs]
    keys = list(dict.fromkeys(k for f in flats for k in f))
    varying = [k for k in keys if len({json.dumps(f.get(k)) for f in flats if f}) > 1 or
               any(f and k not in f for f in flats)]
    if not varying:
        return None
    same = all(all(k in f for k in varying) for f in flats if f)
    cells = []
    for f, r in zip(flats, rows):
        if not f:
            cells.append("-")
            continue
        text = ("/".join(_v(f[k]) for k in varying) if same else
                " ".join(f"{k}={_v(f[k])}" for k in varying if k in f))
        src = r.get("config_source")
        cells.append(text + (f" ({src})" if isinstance(src, str) and src != "tuned" else ""))
    return ("config " + compact_keys(varying) if same else "config"), cells


def compact_keys(keys: list[str]) -> str:
    """`dkdv.BLOCK_M/BLOCK_N/dq.BLOCK_M`: a tuner prefix is written once per run of its keys."""
    out, last = [], None
    for k in keys:
        prefix, _, field = k.rpartition(".")
        out.append(field if prefix and prefix == last else k)
        last = prefix or None
    return "/".join(out)


def _load(run_dir: Path) -> tuple[dict, pd.DataFrame]:
    m = store.load_manifest(run_dir)
    return m, summary_frame(run_dir)  # cases keep the sweep's order: dtype, shape, impl


def render(run_dir: str | Path, console: Console) -> None:
    run_dir = Path(run_dir)
    m, df = _load(run_dir)
    exp = m["experiment"]
    env = m.get("env") or {}
    primary = op_card.primary(m)
    cpu = m.get("device") == "cpu"
    where = env.get("gpu_name") or f"CPU ({env.get('cpu') or 'unknown'})"
    console.print(f"[bold]{exp['name']}[/] · op {exp['op']} · {where} · run {m['run_id']} · "
                  f"status [bold]{store.effective_status(m)}[/]")
    ex = m.get("executor") or {}
    if ex.get("kind") in ("gpus", "ray"):
        console.print(f"[dim]executor {ex['kind']}: GPUs {ex.get('gpus') or '-'} on "
                      f"{', '.join(ex.get('hosts') or []) or '?'}[/]")

    fixed = constant_params(df)
    if fixed:
        console.print("[dim]every case: " + " ".join(f"{k}={_v(v)}" for k, v in fixed.items())
                      + "[/]")
    if cpu:
        console.print("[yellow]CPU run: Triton kernels ran in the interpreter; times are CPU "
                      "wall-clock, useful for checking, not for performance.[/]")
    has_ncu = "ncu_duration_us" in df.columns and df["ncu_duration_us"].notna().any()
    has_k = "kernel_count" in df.columns and df["kernel_count"].notna().any()
    has_roof = "pct_of_roof" in df.columns and df["pct_of_roof"].notna().any()
    has_same = "pct_of_size_copy" in df.columns and df["pct_of_size_copy"].notna().any()
    t = Table(show_lines=False, header_style="bold", pad_edge=False)
    records = df.to_dict("records")
    # one shape (a config grid): "every case" above says it all, no case column
    varied = any(k not in fixed for r in records for k in r["params"])
    cols = [("impl", "left"), *([("case", "left")] if varied else []), ("dtype", "left"),
            ("ok", "center"), ("median ms", "right"), ("spread", "right")]
    if not cpu:  # interpreter timings say nothing about speed: no speedups, no throughput
        cols += [("speedup", "right"), ("TFLOP/s" if primary == "tflops" else "GB/s", "right")]
    for col, just in cols:
        t.add_column(col, justify=just, no_wrap=True)
    if has_roof:
        t.add_column("% roof", justify="right", no_wrap=True)
    if has_same:  # of a copy of the same bytes (calibration's copy curve)
        t.add_column("% copy", justify="right", no_wrap=True)
    t.add_column("peak mem", justify="right", no_wrap=True)
    if has_ncu:
        for col in ("ncu µs", "DRAM %", "occ %", "regs", "top stall"):
            t.add_column(col, justify="right" if col != "top stall" else "left", no_wrap=True)
    if has_k:
        t.add_column("kernels", justify="right", no_wrap=True)
    t.add_column("flags", justify="right", no_wrap=True)
    configs = config_cells(records, m)
    if configs is not None:
        t.add_column(escape(configs[0]), justify="left", no_wrap=True)
    for i, r in enumerate(records):
        sp = _n(r.get("speedup_vs_baseline"))
        speed = "-" if sp is None else ("[dim]base[/]" if r["role"] == "baseline" else
                                        f"[{'green' if sp >= 1 else 'red'}]{sp:.2f}x[/]")
        thr = _n(r.get("tflops" if primary == "tflops" else "gbps"))
        label = " ".join(f"{k}={_v(v)}" for k, v in r["params"].items()
                         if k not in fixed) or r["case_id"]
        cells = [escape(str(r["impl"])), *([escape(label)] if varied else []),
                 DTYPE_SHORT.get(r["dtype"], r["dtype"]), MARK.get(r["status"], r["status"]),
                 fmt_ms(r.get("median_ms")), spread_pct(r)]
        if not cpu:
            cells += [speed, "-" if thr is None else f"{thr:,.1f}"]
        if has_roof:
            pr = _n(r.get("pct_of_roof"))
            cells.append("-" if pr is None else f"{pr:.0f}%")
        if has_same:
            ps = _n(r.get("pct_of_size_copy"))
            cells.append("-" if ps is None else f"{ps:.0f}%")
        cells.append(fmt_bytes(r.get("peak_mem_bytes")))
        if has_ncu:
            for k, f in (("ncu_duration_us", "{:,.1f}"), ("dram_throughput_pct", "{:.0f}"),
                         ("achieved_occupancy_pct", "{:.0f}"),
                         ("registers_per_thread", "{:.0f}")):
                v = _n(r.get(k))
                cells.append("-" if v is None else f.format(v))
            cells.append(_s(r.get("top_stall")))
        if has_k:
            v = _n(r.get("kernel_count"))
            cells.append("-" if v is None else f"{v:.0f}")
        flags = json.loads(r.get("flags") or "[]") if isinstance(r.get("flags"), str) else []
        cells.append(f"[yellow]{len(flags)}[/]" if flags else "")
        if configs is not None:
            cells.append(escape(configs[1][i]))
        t.add_row(*cells)
    console.print(t)
    clock = df["clock"].dropna().unique() if "clock" in df.columns else []
    if len(clock):
        legend = f"timing clock: {', '.join(clock)}; spread = half the p20–p80 range"
        if not cpu:
            legend += "; speedup = baseline median / median (correct cases only)"
        console.print(f"[dim]{legend}[/]")
    for status, text in not_ok_lines(df):
        console.print(f"[{'dim' if status == 'skipped' else 'red'}]{status}[/] {escape(text)}",
                      highlight=False)
    for r in df.to_dict("records"):
        for fl in json.loads(r.get("flags") or "[]") if isinstance(r.get("flags"), str) else []:
            console.print(f"[yellow]flag[/] {r['case_id']}: {fl}")
    for r in df.to_dict("records"):  # verdicts of profiled cases (the table has % roof)
        if r.get("verdict") and _n(r.get("ncu_duration_us")) is not None:
            console.print(f"[cyan]verdict[/] {r['case_id']}: {r['verdict']}")
    render_hot_lines(run_dir, console)
    by_state: dict[str, list[str]] = {}
    for name, state in (m.get("passes") or {}).items():
        # not done, or done with profiles carried from the previous run (profile_carry)
        if not str(state).startswith("done") or " carried from " in str(state):
            by_state.setdefault(str(state), []).append(name)
    for state, names in by_state.items():  # e.g. "ncu, nsys: skipped: no CUDA device ..."
        console.print(f"[dim]{', '.join(names)}: {state}[/]", soft_wrap=True)
    if m.get("pass_wall_s"):
        from harness.execute.runner import wall_line

        console.print(wall_line(m["pass_wall_s"]))
    from harness.execute.timeline import plan_line, profiler_line, timeline_line

    if m.get("pass_spans_s"):  # when each phase ran: what overlapped, what the run waited on
        console.print(f"[dim]{escape(timeline_line(m['pass_spans_s']))}[/]", soft_wrap=True)
    if line := profiler_line(m.get("profiler_wall_s") or {}):
        console.print(f"[dim]{escape(line)}[/]", soft_wrap=True)
    if line := plan_line(m.get("profiler_plan"), m.get("pass_spans_s") or {}):
        console.print(f"[dim]{escape(line)}[/]", soft_wrap=True)
    render_since(run_dir, console)


def render_since(run_dir: Path, console: Console) -> None:
    """The since-last-run block (analysis.since), from the manifest's `against` record."""
    from harness.analysis.since import print_since, since_data

    s = since_data(run_dir)
    if s is not None:
        print_since(s, console)


def not_ok_groups(df: pd.DataFrame) -> list[dict]:
    """The cases that did not pass, as {status, impl, case_id, count, total, error}: one per
    failed/errored/timed-out case; skipped cases, which share their reason (a CPU run's
    CUDA-only impls), one per (impl, reason) with case_id None and the count of that impl's
    cases. Each case keeps its own reason in the store."""
    out: list[dict] = []
    skipped: dict[tuple[str, str], dict] = {}
    total = df["impl"].value_counts() if len(df) else {}
    for r in df.to_dict("records"):
        if r["status"] not in ("failed", "error", "timeout", "skipped") or not r.get("error"):
            continue
        g = {"status": r["status"], "impl": r["impl"], "case_id": r["case_id"], "count": 1,
             "total": int(total[r["impl"]]), "error": str(r["error"])}
        if r["status"] != "skipped":
            out.append(g)
        elif (r["impl"], g["error"]) in skipped:
            skipped[(r["impl"], g["error"])]["count"] += 1
        else:
            skipped[(r["impl"], g["error"])] = g
            out.append(g)
            g["case_id"] = None
    return out


def not_ok_lines(df: pd.DataFrame) -> list[tuple[str, str]]:
    """(status, text) per not_ok_groups entry: `sdpa_flash: 8 of 8 cases: needs a CUDA ...`."""
    return [(g["status"], f"{g['case_id']}: {g['error']}" if g["case_id"] else
             f"{g['impl']}: {g['count']} of {g['total']} case{'s' if g['total'] != 1 else ''}: "
             f"{g['error']}") for g in not_ok_groups(df)]


# -- hot source lines (ncu SourceCounters) -------------------------------------------------------

HOT_LINES = 5


def hot_line_text(r: dict) -> str:
    """`flash_fwd.py:97  31.2 %  long_scoreboard 60 %, barrier 30 %  qk = tl.dot(q, k)`."""
    from harness.profilers.ncu_source import mix_text

    where = f"{Path(str(r['file'])).name}:{int(r['line'])}"
    tag = "[triton] " if r.get("library") else ""
    return (f"{where:<22} {r['share'] * 100:5.1f} %  {mix_text(r['stall_mix'], r['samples']):<40}"
            f"  {tag}{str(r.get('text') or '').strip()}")


def render_hot_lines(run_dir: Path, console: Console, n: int = HOT_LINES) -> None:
    """The n source lines with the most warp-stall samples per profiled kernel."""
    from rich.markup import escape

    from harness.profilers.ncu_source import top_lines

    lines = store.load_source_lines(run_dir)
    if lines.empty:
        return
    for (case_id, kernel), g in top_lines(lines, n).groupby(["case_id", "kernel"], sort=False):
        console.print(f"[bold]hot lines[/] {escape(str(case_id))} · {escape(str(kernel))} "
                      f"[dim](share of the kernel's warp samples; top stall reasons)[/]")
        for r in g.to_dict("records"):
            console.print("  " + escape(hot_line_text(r)), soft_wrap=True, highlight=False)


def source_lines_json(run_dir: Path, n: int = HOT_LINES) -> dict[str, list[dict]]:
    """case_id -> its top source lines (all kernels), stall_mix as an object."""
    from harness.profilers.ncu_source import top_lines

    lines = store.load_source_lines(run_dir)
    out: dict[str, list[dict]] = {}
    for r in top_lines(lines, n).to_dict("records") if len(lines) else []:
        out.setdefault(r["case_id"], []).append({
            "kernel": r["kernel"], "file": r["file"], "line": int(r["line"]), "text": r["text"],
            "samples": float(r["samples"]), "share": float(r["share"]),
            "stall_mix": json.loads(r["stall_mix"]), "library": bool(r["library"])})
    return out


def to_json(run_dir: str | Path) -> dict:
    """Manifest essentials + one object per case with its canonical metrics per kernel."""
    run_dir = Path(run_dir)
    m, df = _load(run_dir)
    metrics = store.load_metrics(run_dir)
    per_case: dict[str, list] = {}
    if len(metrics):
        for (case_id, source, kernel), g in metrics.groupby(["case_id", "source", "kernel"],
                                                             sort=False):
            per_case.setdefault(case_id, []).append({
                "source": source, "kernel": kernel,
                "metrics": {n: (v if u in ("", None) or n != "occupancy_limiter" else u)
                            for n, v, u in zip(g.name, g.value, g.unit)},
                "units": dict(zip(g.name, g.unit))})
    cases = []
    hot = source_lines_json(run_dir)
    for r in json.loads(df.to_json(orient="records")):
        r["flags"] = json.loads(r["flags"]) if isinstance(r.get("flags"), str) else []
        # provenance as objects: config {tuner: {field: value}}, compiled [per kernel]
        r["config"] = parse_config(r.get("config")) or None
        r["compiled"] = (json.loads(r["compiled"]) if isinstance(r.get("compiled"), str)
                         else None)
        for k in ("config_source", "code_hash"):
            r.setdefault(k, None)
        r["kernels"] = per_case.get(r["case_id"], [])
        r["source_lines"] = hot.get(r["case_id"], [])
        cases.append(r)
    from harness.analysis.since import since_data, since_json

    return {"run_id": m["run_id"], "status": store.effective_status(m),
            "experiment": m["experiment"], "executor": m.get("executor"),
            "pass_wall_s": m.get("pass_wall_s"), "pass_spans_s": m.get("pass_spans_s"),
            "since": since_json(since_data(run_dir)),
            "env": m.get("env"), "device": m.get("device"), "passes": m.get("passes"),
            "cases": cases, "run_level_metrics": per_case.get("", [])}
