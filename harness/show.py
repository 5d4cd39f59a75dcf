"""The summary of a stored run: a rich table for people, JSON for programs (`harness show`)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from harness import store
from harness.analysis.summary import summary_frame
from harness.spec import DTYPE_SHORT
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


def _primary(op_name: str) -> str:
    from harness.registry import registry

    try:
        return registry().get_op(op_name).primary
    except Exception:  # an op no longer registered still shows its run
        return "gbps"


def _load(run_dir: Path) -> tuple[dict, pd.DataFrame]:
    m = store.load_manifest(run_dir)
    return m, summary_frame(run_dir)  # cases keep the sweep's order: dtype, shape, impl


def render(run_dir: str | Path, console: Console) -> None:
    run_dir = Path(run_dir)
    m, df = _load(run_dir)
    exp = m["experiment"]
    env = m.get("env") or {}
    primary = _primary(exp["op"])
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
    t = Table(show_lines=False, header_style="bold", pad_edge=False)
    cols = [("impl", "left"), ("case", "left"), ("dtype", "left"), ("ok", "center"),
            ("median ms", "right"), ("spread", "right")]
    if not cpu:  # interpreter timings say nothing about speed: no speedups, no throughput
        cols += [("speedup", "right"), ("TFLOP/s" if primary == "tflops" else "GB/s", "right")]
    for col, just in cols:
        t.add_column(col, justify=just, no_wrap=True)
    if has_roof:
        t.add_column("% roof", justify="right")
    t.add_column("peak mem", justify="right")
    if has_ncu:
        for col in ("ncu µs", "DRAM %", "occ %", "regs", "top stall"):
            t.add_column(col, justify="right" if col != "top stall" else "left")
    if has_k:
        t.add_column("kernels", justify="right")
    t.add_column("flags", justify="right")
    for r in df.to_dict("records"):
        sp = _n(r.get("speedup_vs_baseline"))
        speed = "-" if sp is None else ("[dim]base[/]" if r["role"] == "baseline" else
                                        f"[{'green' if sp >= 1 else 'red'}]{sp:.2f}x[/]")
        thr = _n(r.get("tflops" if primary == "tflops" else "gbps"))
        label = " ".join(f"{k}={_v(v)}" for k, v in r["params"].items()
                         if k not in fixed) or r["case_id"]
        cells = [r["impl"], label,
                 DTYPE_SHORT.get(r["dtype"], r["dtype"]), MARK.get(r["status"], r["status"]),
                 fmt_ms(r.get("median_ms")), spread_pct(r)]
        if not cpu:
            cells += [speed, "-" if thr is None else f"{thr:,.1f}"]
        if has_roof:
            pr = _n(r.get("pct_of_roof"))
            cells.append("-" if pr is None else f"{pr:.0f}%")
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
        t.add_row(*cells)
    console.print(t)
    clock = df["clock"].dropna().unique() if "clock" in df.columns else []
    if len(clock):
        legend = f"timing clock: {', '.join(clock)}; spread = half the p20–p80 range"
        if not cpu:
            legend += "; speedup = baseline median / median (correct cases only)"
        console.print(f"[dim]{legend}[/]")
    for r in df.to_dict("records"):
        if r["status"] in ("failed", "error", "timeout", "skipped") and r.get("error"):
            console.print(f"[red]{r['status']}[/] {r['case_id']}: {r['error']}")
    for r in df.to_dict("records"):
        for fl in json.loads(r.get("flags") or "[]") if isinstance(r.get("flags"), str) else []:
            console.print(f"[yellow]flag[/] {r['case_id']}: {fl}")
    for r in df.to_dict("records"):  # verdicts of profiled cases (the table has % roof)
        if r.get("verdict") and _n(r.get("ncu_duration_us")) is not None:
            console.print(f"[cyan]verdict[/] {r['case_id']}: {r['verdict']}")
    render_hot_lines(run_dir, console)
    by_state: dict[str, list[str]] = {}
    for name, state in (m.get("passes") or {}).items():
        if not str(state).startswith("done"):
            by_state.setdefault(str(state), []).append(name)
    for state, names in by_state.items():  # e.g. "ncu, nsys: skipped: no CUDA device ..."
        console.print(f"[dim]{', '.join(names)}: {state}[/]", soft_wrap=True)
    if m.get("pass_wall_s"):
        from harness.runner import wall_line

        console.print(wall_line(m["pass_wall_s"]))
    render_since(run_dir, console)


def render_since(run_dir: Path, console: Console) -> None:
    """The since-last-run block (analysis.since), from the manifest's `against` record."""
    from harness.analysis.since import print_since, since_data

    s = since_data(run_dir)
    if s is not None:
        print_since(s, console)


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
        r["kernels"] = per_case.get(r["case_id"], [])
        r["source_lines"] = hot.get(r["case_id"], [])
        cases.append(r)
    from harness.analysis.since import since_data, since_json

    return {"run_id": m["run_id"], "status": store.effective_status(m),
            "experiment": m["experiment"], "executor": m.get("executor"),
            "pass_wall_s": m.get("pass_wall_s"), "since": since_json(since_data(run_dir)),
            "env": m.get("env"), "device": m.get("device"), "passes": m.get("passes"),
            "cases": cases, "run_level_metrics": per_case.get("", [])}
