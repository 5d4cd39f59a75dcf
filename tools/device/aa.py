"""A/A counts of issue #34: unchanged code measured twice must give no faster/slower mark.

    source .devcarry/env.sh; python tools/device/aa.py r2r experiments/softmax.yaml
    source .devcarry/env.sh; python tools/device/aa.py ab  experiments/flash.yaml

(repository root, one GPU; results under $OUT, else ./aa_out)

    r2r  `harness run` twice into a fresh store, then `compare` of the two: the marks per
         implementation and per method (measured: the cases' own between-process spread), and
         each run's pass walls (the time pass's against the target: flash.yaml 1.3 x 39.6 s)
    ab   `harness run` once (what timing one version costs), then `harness ab --base HEAD` on
         the unchanged tree: its marks, and its wall against 2 x the run's (target <= 1.5 x)

The profilers are left out (a copy of the YAML with `profile: {}` in $OUT) unless --profilers:
they do not touch the timings. `--processes 1` times each case in one process, as before this
change: the baseline of the time pass's wall on the same machine. `ab --base HEAD` needs HEAD to be the working tree's kernels:
the script commits a snapshot of kernels/ into a throwaway git directory ($OUT/aa.git, used
through GIT_DIR / GIT_WORK_TREE), so it works on a copy without .git or with local edits.
Writes $OUT/aa_<mode>_<experiment>.md / .json and the commands' output to .log files.
flash.yaml: ~5 min per mode on an H100; softmax.yaml: ~1.5 min.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def git_env(out: Path) -> dict[str, str]:
    """A throwaway git directory whose HEAD is a snapshot of ROOT's kernels/ now."""
    gd = out / "aa.git"
    env = {**os.environ, "GIT_DIR": str(gd), "GIT_WORK_TREE": str(ROOT),
           "GIT_AUTHOR_NAME": "aa", "GIT_AUTHOR_EMAIL": "aa@kernel-lab",
           "GIT_COMMITTER_NAME": "aa", "GIT_COMMITTER_EMAIL": "aa@kernel-lab"}
    if not gd.exists():
        subprocess.run(["git", "init", "-q"], env=env, check=True, cwd=ROOT)
    subprocess.run(["git", "add", "-A", "kernels"], env=env, check=True, cwd=ROOT)
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "aa snapshot"], env=env,
                   check=True, cwd=ROOT)
    return env


def harness(env: dict, log: Path, *args: str, timeout: float = 560) -> tuple[int, str, float]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    with open(log, "a") as f:
        f.write(f"$ harness {' '.join(args)}  [{wall:.1f} s, exit {p.returncode}]\n"
                f"{p.stdout}\n{p.stderr}\n")
    if p.returncode != 0:
        raise RuntimeError(f"harness {args[0]} failed (exit {p.returncode}); see {log}")
    return p.returncode, p.stdout, wall


def ab_pair(store: Path, new: set[str]) -> tuple[str, str]:
    """(base, head) run ids of the `harness ab` pair among the runs `new`."""
    role = {r: json.loads((store / r / "manifest.json").read_text())["ab"]["role"] for r in new}
    return (next(r for r in new if role[r] == "base"), next(r for r in new if role[r] == "head"))


def runs_of(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir() if (p / "manifest.json").exists()) \
        if store.exists() else []


def marks(time_rows: list[dict]) -> dict:
    """{impl: {mark: n}} and {method: {mark: n}} of a compare's rows."""
    by_impl: dict[str, dict] = {}
    by_method: dict[str, dict] = {}
    for r in time_rows:
        for d, k in ((by_impl, r["impl"]), (by_method, r.get("method") or "?")):
            d.setdefault(k, {})
            d[k][r["mark"]] = d[k].get(r["mark"], 0) + 1
    return {"impl": by_impl, "method": by_method,
            "marked": sum(r["mark"] in ("faster", "slower") for r in time_rows),
            "pairs": len(time_rows),
            "marked_rows": [f"{r['key']}: {r['text']}" for r in time_rows
                            if r["mark"] in ("faster", "slower")]}


def _plain(o):
    """numpy scalars and arrays in the JSON dump"""
    return o.tolist() if hasattr(o, "tolist") else str(o)


def details(store: Path, pair, time_rows: list[dict]) -> list[dict]:
    """Every pair not judged `same`: its figures, and each side's per-process medians, launch
    config and SM clock from results.parquet (what tells a between-run shift from a process's)."""
    import pandas as pd

    res = []
    for run in pair:
        f = store / run / "results.parquet"
        res.append(pd.read_parquet(f).set_index("case_id") if f.exists() else None)
    out = []
    for r in time_rows:
        if r["mark"] == "same":
            continue
        d = {k: r.get(k) for k in ("key", "mark", "base_ms", "cand_ms", "ratio", "ci_low",
                                   "ci_high", "threshold", "mde", "method", "text")}
        for side, df, cid in (("base", res[0], r.get("base_case_id")),
                              ("cand", res[1], r.get("cand_case_id"))):
            if df is None or cid not in df.index:
                continue
            row = df.loc[cid]
            d[side] = {k: (row[k] if k in row and row[k] == row[k] else None)
                       for k in ("process_medians_ms", "config", "sm_clock_timed_mhz",
                                 "n_samples", "rel_stderr")}
            pm = d[side]["process_medians_ms"]
            if pm is not None and not isinstance(pm, str):
                d[side]["process_medians_ms"] = [float(x) for x in pm]
        out.append(d)
    return out


def experiment_copy(exp: Path, out: Path, profilers: bool, processes: int | None) -> Path:
    if profilers and processes is None:
        return exp
    import yaml

    data = yaml.safe_load(exp.read_text())
    if not profilers:
        data["profile"] = {}
    if processes is not None:
        data.setdefault("timing", {})["processes"] = processes
    dest = out / f"{exp.stem}{f'_p{processes}' if processes else ''}.yaml"
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def walls(store: Path, run: str) -> dict:
    m = json.loads((store / run / "manifest.json").read_text())
    return m.get("pass_wall_s") or {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("r2r", "ab"))
    ap.add_argument("experiment")
    ap.add_argument("--out", default=os.environ.get("OUT") or "aa_out")
    ap.add_argument("--profilers", action="store_true", help="keep the YAML's ncu/nsys passes")
    ap.add_argument("--cpu", action="store_true", help="the smoke sweep on the CPU (tests)")
    ap.add_argument("--processes", type=int, default=None,
                    help="timing.processes in the copy (1: the time pass as before this "
                         "change, for its wall; its pairs fall back to the A/A floor)")
    a = ap.parse_args(argv)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    exp = experiment_copy((ROOT / a.experiment).resolve(), out, a.profilers, a.processes)
    name = Path(a.experiment).stem + (f"_p{a.processes}" if a.processes else "")
    store = out / f"store_{a.mode}_{name}"
    log = out / f"aa_{a.mode}_{name}.log"
    extra = ["--device", "cpu", "--smoke"] if a.cpu else []
    env = git_env(out) if a.mode == "ab" else dict(os.environ)
    env["COLUMNS"] = "200"
    result: dict = {"experiment": a.experiment, "mode": a.mode}
    _, _, w1 = harness(env, log, "run", str(exp), "--store", str(store), "--against", "none",
                       *extra)
    first = runs_of(store)[-1]
    result["run_walls"] = [{"command_s": round(w1, 1), **walls(store, first)}]
    if a.mode == "r2r":
        _, _, w2 = harness(env, log, "run", str(exp), "--store", str(store), "--against",
                           "none", *extra)
        second = runs_of(store)[-1]
        result["run_walls"].append({"command_s": round(w2, 1), **walls(store, second)})
        pair = (first, second)
    else:
        before = set(runs_of(store))
        _, _, wab = harness(env, log, "ab", str(exp), "--base", "HEAD", "--store", str(store),
                            *extra)
        pair = ab_pair(store, set(runs_of(store)) - before)
        result["ab_wall_s"] = round(wab, 1)
        result["ab_vs_two_runs"] = round(wab / (2 * w1), 2)
        # the passes alone: ab's check + interleaved time against a run's check + time, twice
        ab_walls, run_walls = walls(store, pair[1]), result["run_walls"][0]
        result["ab_walls"] = ab_walls
        measure = sum(run_walls.get(k, 0.0) for k in ("check", "time"))
        if measure and ab_walls.get("ab"):
            result["ab_pass_vs_two_check_time"] = round(ab_walls["ab"] / (2 * measure), 2)
    _, js, _ = harness(env, log, "compare", *pair, "--store", str(store), "--format", "json")
    c = json.loads(js)
    result.update(pair=pair, **marks(c["time"]), noise=c["notes"][0] if c["notes"] else "")
    result["not_same"] = details(store, pair, c["time"])
    lines = [f"## A/A {a.mode} {a.experiment}", "",
             f"- pairs {result['pairs']}, marked faster/slower: **{result['marked']}**",
             f"- by method: {json.dumps(result['method'])}",
             f"- by implementation: {json.dumps(result['impl'])}",
             f"- {result['noise']}"]
    lines += [f"- marked: {r}" for r in result["marked_rows"]]
    lines += [f"- run {i + 1} walls: {json.dumps(w)}" for i, w in enumerate(result["run_walls"])]
    if a.mode == "ab":
        lines.append(f"- ab wall {result['ab_wall_s']} s = {result['ab_vs_two_runs']} x two "
                     f"runs' ({2 * w1:.1f} s); ab's passes {json.dumps(result['ab_walls'])}, "
                     f"its check + time {result.get('ab_pass_vs_two_check_time')} x two runs' "
                     "check + time")
    md = "\n".join(lines) + "\n"
    (out / f"aa_{a.mode}_{name}.md").write_text(md)
    (out / f"aa_{a.mode}_{name}.json").write_text(json.dumps(result, indent=2, default=_plain))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
