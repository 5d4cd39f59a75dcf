"""`harness picks RUN`: which launch configuration each Tuner (or `triton.autotune` kernel) picked
in a run, and the timings the pick rests on.

A timed pick is stored with its evidence (kernels/_tuner.py): every candidate's first-pass
milliseconds (the median of L2-flushed launches), the finalists' scores (geometric mean of
interleaved rounds) and, for a candidate that did not compile or run, its error. An autotuned
kernel's pick carries the autotuner's own timings of each config (harness.tuning.autotune: the
median of its do_bench), a config it timed as inf or pruned with an error. A pick that surprises
— a case slower than a forced variant of another config in the same run — can be checked here:
was the faster config a candidate, did it fail, how far apart were they?

    python -m harness picks RUN [--tuner NAME] [--format table|json]
"""
from __future__ import annotations

import argparse
import json
import math

from rich.console import Console
from rich.table import Table

from harness import store
from harness.errors import HarnessError
from harness.store.option import add_store_argument

HELP = ("the Tuners' and autotuners' launch-config picks of a run, with every candidate's "
        "timing or error")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run id (under --store) or run directory")
    p.add_argument("--tuner", help="only this Tuner (e.g. groupnorm_mish)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    add_store_argument(p)


def _fmt_config(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def rows(evidence: dict, picked: dict) -> list[dict]:
    """The evidence's candidates, fastest first (by finalist score, then first pass), failures
    last, each with `vs_pick` (its time over the pick's, same measure) and `picked`."""
    cands = [dict(c) for c in evidence.get("candidates", [])]
    pick = next((c for c in cands if c.get("config") == picked), None)
    for c in cands:
        c["picked"] = c is pick
        ref = None
        if pick is not None:
            if "final_ms" in c and "final_ms" in pick:
                ref = c["final_ms"] / pick["final_ms"]
            elif "ms" in c and "ms" in pick:
                ref = c["ms"] / pick["ms"]
        c["vs_pick"] = ref

    def order(c):
        if "ms" not in c:
            return (2, math.inf)
        return (0 if "final_ms" in c else 1, c.get("final_ms", c["ms"]))
    return sorted(cands, key=order)


def main(a, console: Console) -> int:
    run_dir = store.resolve_run(a.run, a.store)
    picks = store.load_tuner_picks(run_dir)
    if a.tuner:
        if a.tuner not in picks:
            raise HarnessError(f"--tuner: no picks of {a.tuner!r} in {run_dir.name} "
                               f"(tuners: {', '.join(sorted(picks)) or 'none'})")
        picks = {a.tuner: picks[a.tuner]}
    if a.format == "json":
        print(json.dumps(picks, indent=2, default=str))
        return 0
    if not picks:
        console.print(f"{run_dir.name}: no picks stored (nothing was tuned or autotuned on a GPU)")
        return 0
    for tuner, by_key in sorted(picks.items()):
        for key, rec in sorted(by_key.items()):
            cfg, src = rec.get("config", {}), rec.get("source", "?")
            ev = rec.get("evidence")
            console.print(f"[bold]{tuner}[/bold] {key}: {_fmt_config(cfg)} ({src})")
            if not ev:
                console.print("  no timings stored (a pick kept from an earlier run, or "
                              "recorded before picks kept their evidence)")
                continue
            t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
            for col in ("", "config", "first us", "final us", "x pick", "error"):
                t.add_column(col, justify="right" if "us" in col or col == "x pick" else "left")
            for c in rows(ev, cfg):
                t.add_row("*" if c["picked"] else "", _fmt_config(c["config"]),
                          f"{c['ms'] * 1e3:.1f}" if "ms" in c else "",
                          f"{c['final_ms'] * 1e3:.1f}" if "final_ms" in c else "",
                          f"{c['vs_pick']:.2f}" if c["vs_pick"] else "", c.get("error", ""))
            console.print(t)
            if "bench_s" in ev:  # a triton.autotune kernel's own timings (harness.tuning.autotune)
                console.print(f"  timed by {ev.get('by', 'the autotuner')}: {ev['bench_s']:.1f} s "
                              "(compile included)")
            else:
                wait = ev.get("wait_s") or 0
                console.print(f"  compile {ev.get('compile_s', 0):.1f} s, timing "
                              f"{ev.get('timing_s', 0):.1f} s"
                              + (f" (of which {wait:.1f} s waiting for the GPU)" if wait >= 0.05
                                 else ""))
    return 0
