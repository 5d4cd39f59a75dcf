"""carry_diff.py STORE: each run of STORE (oldest first) with its pass walls, pass states and
carried cases; then ncu's rows of the first run against the last (a fresh profile of the same
code twice: how far two profiles of unchanged code differ, per metric) and, with three runs or
more, the second run's rows against the first's (carried rows are the first run's)."""
import json
import sys
from pathlib import Path

import pandas as pd


def ncu(run: Path) -> pd.Series:
    m = pd.read_parquet(run / "metrics.parquet")
    return m[m.source == "ncu"].groupby(["case_id", "name"])["value"].first()


def main(store: str) -> None:
    runs = sorted(p for p in Path(store).iterdir() if (p / "manifest.json").exists())
    for r in runs:
        m = json.loads((r / "manifest.json").read_text())
        print(r.name, m.get("status"), "pass_wall_s", m.get("pass_wall_s"))
        print("   passes", m.get("passes"))
        for name, rec in (m.get("profiler_wall_s") or {}).items():
            print("  ", name, {k: rec.get(k) for k in ("cases", "wall_s", "run_s", "export_s")},
                  "carried:", rec.get("carried"))
    if len(runs) < 2:
        return
    first, last = ncu(runs[0]), ncu(runs[-1])
    j = pd.concat([first.rename("first"), last.rename("last")], axis=1).dropna()
    j = j[pd.to_numeric(j["first"], errors="coerce").notna()].astype(float)
    j["rel"] = (j["last"] - j["first"]).abs() / j["first"].abs().clip(lower=1e-12)
    print("ncu rows first/last:", len(first), len(last), "joined numeric:", len(j))
    print("largest relative differences, first run against last, per metric (max over cases):")
    print(j.groupby("name")["rel"].max().sort_values(ascending=False).head(25).to_string())
    if len(runs) >= 3:
        second = ncu(runs[1])
        k = pd.concat([first.rename("first"), second.rename("second")], axis=1)
        same = k["first"].astype(str) == k["second"].astype(str)
        print("second run against the first: rows", len(second), "identical", int(same.sum()),
              "of", len(k))


if __name__ == "__main__":
    main(sys.argv[1])
