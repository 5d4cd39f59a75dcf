"""The committed example runs (runs/examples/) that tests render: a fixed, representative handful.

Every optimisation step commits its before/after runs, so a test that renders every example
grows with the store (the suite crossed an hour that way). Tests that render pages or reports
take `representative()`: the newest run of each experiment, plus the runs tests name. That every
example still loads is checked cheaply (manifests and parquet schemas) in test_examples_load.py.
"""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "runs" / "examples"

# runs that tests need by name (their content is asserted in detail)
NAMED = (
    "20261122T030028Z-flash-attention-fwd-cbc8",  # 280 cases, every pass: report budget tests
    "20261123T111718Z-tune-flash-bwd-dkdv-4b29",  # a config grid: implementations down
)


def all_runs() -> list[Path]:
    """Every committed example run directory, oldest first."""
    return sorted(p for p in EXAMPLES.glob("2*") if (p / "manifest.json").is_file())


def newest_per_experiment() -> list[Path]:
    """The newest run of each experiment name (run ids start with a UTC timestamp)."""
    newest: dict[str, Path] = {}
    for run in all_runs():
        name = json.loads((run / "manifest.json").read_text())["experiment"]["name"]
        newest[name] = run  # sorted oldest first: the last one wins
    return sorted(newest.values())


def representative() -> list[Path]:
    """The newest run of each experiment plus the runs tests name, oldest first."""
    named = [EXAMPLES / n for n in NAMED if (EXAMPLES / n).is_dir()]
    return sorted(set(newest_per_experiment()) | set(named))


def newest_per_kind() -> list[Path]:
    """The newest run of each kind: op, mode, and whether it is a config grid (`tune-*`), plus
    the runs tests name; fewer than representative() (a dashboard render of every page costs
    several seconds a run), the same kinds of table and chart."""
    newest: dict[tuple, Path] = {}
    for run in all_runs():
        exp = json.loads((run / "manifest.json").read_text())["experiment"]
        kind = (exp["op"], (exp.get("params") or {}).get("mode"),
                exp["name"].startswith("tune-"))
        newest[kind] = run
    named = [EXAMPLES / n for n in NAMED if (EXAMPLES / n).is_dir()]
    return sorted(set(newest.values()) | set(named))
