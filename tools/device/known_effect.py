"""The detection table of issue #34: does `harness ab` / run-to-run `compare` see a known effect?

    source .devcarry/env.sh; python tools/device/known_effect.py ab  [--effects 0,1,2,5]
    source .devcarry/env.sh; python tools/device/known_effect.py r2r [--effects 0,1,2,5]

(repository root, on one GPU; results under $OUT, else ./known_effect_out). The op is
kernels/known_effect (a Triton copy that moves EXTRA more bytes), copied into a throwaway git
repository as package `ke_user` (op `known_effect_user`, loaded with HARNESS_OPS) and
committed once per effect: e0 (EXTRA 0), e0b (EXTRA 0, the file edited: the same kernel from
another commit), e1, e2, e5 (EXTRA 0.01, 0.02, 0.05). Then

    ab   for each effect: the repository checked out at its commit, `harness ab --base e0`
         (e0b stands for 0 %): the head (the working tree) against e0, interleaved
    r2r  `harness run` at e0, then at e0b, e1, e2, e5, each compared with e0's run

and the table: per effect and method, the Triton cases marked slower / same / ambiguous /
faster (all 24, and the ones of >= 50 us), the median MDE, and the torch control's marks (its
code never changes: an A/A count inside every row). Written to $OUT/detection_<mode>.md and
.json; each step's output to $OUT/<mode>_<effect>.log. ~4 min per mode on an H100.
`--cpu` runs the same on the CPU with the smoke sweep (what the tests do); `--cases` narrows.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aa import _plain, details  # noqa: E402  (not-same pairs, per-process medians)

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "kernels" / "known_effect"
PACKAGE = "ke_user"
OP = "known_effect_user"
EFFECTS = {"0": ("e0b", 0.0), "1": ("e1", 0.01), "2": ("e2", 0.02), "5": ("e5", 0.05)}
LONG_MS = 0.05  # "cases of >= 50 us"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def write_package(repo: Path, extra: float, note: str = "") -> None:
    """kernels/known_effect as package `ke_user` of op `known_effect_user` with EXTRA set."""
    pkg = repo / PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    for src in SOURCE.glob("*.py"):
        text = src.read_text()
        if src.name == "__init__.py":
            text = re.sub(r'^NAME = .*$', f'NAME = "{OP}"', text, count=1, flags=re.M)
            text = re.sub(r'^EXTRA = .*$', f"EXTRA = {extra!r}{note}", text, count=1,
                          flags=re.M)
        (pkg / src.name).write_text(text)


def make_repo(repo: Path, effects: list[str], experiment: Path | None = None,
              timing: dict | None = None, smoke: str | None = None) -> dict[str, str]:
    """The throwaway repository: commit e0 (EXTRA 0), then one per effect (e0b for 0 %),
    tagged; the experiment YAML (experiments/known_effect.yaml for op known_effect_user, with
    `timing` merged and `smoke` replacing its smoke line) beside it, uncommitted. Returns
    tag -> sha."""
    import yaml

    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    for k, v in (("user.email", "known-effect@kernel-lab"), ("user.name", "known effect")):
        _git(repo, "config", k, v)
    tags = {}
    steps = [("e0", 0.0, "")] + [(EFFECTS[e][0], EFFECTS[e][1],
                                  "  # the same kernel, another commit" if e == "0" else "")
                                 for e in effects]
    for tag, extra, note in steps:
        write_package(repo, extra, note)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"{tag}: EXTRA = {extra}")
        _git(repo, "tag", tag)
        tags[tag] = _git(repo, "rev-parse", "HEAD")
    exp = yaml.safe_load((experiment or ROOT / "experiments" / "known_effect.yaml").read_text())
    exp.update(name=OP, op=OP)
    if timing:
        exp["timing"] = {**exp.get("timing", {}), **timing}
    if smoke is not None:
        exp["smoke"] = yaml.safe_load(smoke)
    (repo / "known_effect.yaml").write_text(yaml.safe_dump(exp, sort_keys=False))
    return tags


def env_for(repo: Path) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(repo)] + ([os.environ["PYTHONPATH"]]
                                                     if os.environ.get("PYTHONPATH") else []))
    return {**os.environ, "HARNESS_OPS": PACKAGE, "PYTHONPATH": path, "COLUMNS": "200"}


def harness(repo: Path, log: Path, *args: str, timeout: float = 600) -> tuple[int, str, float]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, env=env_for(repo),
                       capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    with open(log, "a") as f:
        f.write(f"$ harness {' '.join(args)}  [{wall:.1f} s, exit {p.returncode}]\n"
                f"{p.stdout}\n{p.stderr}\n")
    return p.returncode, p.stdout, wall


def compare_json(repo: Path, log: Path, store: Path, base: str, cand: str) -> dict:
    rc, out, _ = harness(repo, log, "compare", base, cand, "--store", str(store),
                         "--format", "json")
    if rc != 0:
        raise RuntimeError(f"compare {base} {cand} failed (exit {rc}); see {log}")
    return json.loads(out)


def ab_pair(store: Path, new: set[str]) -> tuple[str, str]:
    """(base, head) run ids of the `harness ab` pair among the runs `new`."""
    role = {r: json.loads((store / r / "manifest.json").read_text())["ab"]["role"] for r in new}
    return (next(r for r in new if role[r] == "base"), next(r for r in new if role[r] == "head"))


def runs_of(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir() if (p / "manifest.json").exists())


def summarize(time_rows: list[dict], impl: str) -> dict:
    """Marks of one implementation's pairs (all, and those of >= LONG_MS), median MDE."""
    import statistics

    rows = [r for r in time_rows if r["impl"] == impl]
    long = [r for r in rows if (r.get("base_ms") or 0) >= LONG_MS]

    def count(rs):
        out = {m: 0 for m in ("slower", "same", "ambiguous", "faster", "missing", "unjudged")}
        for r in rs:
            out[r["mark"]] = out.get(r["mark"], 0) + 1
        return out

    mdes = [r["mde"] for r in rows if isinstance(r.get("mde"), (int, float))
            and r["mde"] == r["mde"]]
    # the time the extra bytes cost, as measured (ratio is base/head): what a row detects
    effect = [1 / r["ratio"] - 1 for r in long if isinstance(r.get("ratio"), (int, float))
              and r["ratio"] == r["ratio"] and r["ratio"] > 0]
    return {"n": len(rows), "marks": count(rows), "n_long": len(long), "long": count(long),
            "mde_median": statistics.median(mdes) if mdes else None,
            "effect_long": ([statistics.median(effect), min(effect), max(effect)] if effect
                            else None),
            "methods": sorted({r.get("method") for r in rows})}


def table(rows: list[dict]) -> str:
    """The detection table as Markdown."""
    def cell(m):
        return f"{m['slower']} / {m['same']} / {m['ambiguous']}" + (
            f" (+{m['faster']} faster)" if m["faster"] else "") + (
            f" (+{m['unjudged']} unjudged)" if m["unjudged"] else "") + (
            f" (+{m['missing']} missing)" if m["missing"] else "")

    out = ["| effect | method | triton: slower / same / ambiguous (all) | "
           "the same, cases >= 50 us | their time moved (median, min-max) | MDE median | "
           "torch control (A/A) | wall s |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t, c = r["triton"], r["torch"]
        mde = f"{t['mde_median'] * 100:.2f}%" if t["mde_median"] is not None else "-"
        e = t.get("effect_long")
        moved = (f"{e[0] * 100:+.1f}% ({e[1] * 100:+.1f} to {e[2] * 100:+.1f})" if e else "-")
        out.append(f"| {r['effect']} % | {r['method']} | {cell(t['marks'])} of {t['n']} | "
                   f"{cell(t['long'])} of {t['n_long']} | {moved} | {mde} | "
                   f"{cell(c['marks'])} of {c['n']} | {r['wall_s']:.0f} |")
    return "\n".join(out) + "\n"


def run_ab(repo: Path, out: Path, effects: list[str], extra: list[str]) -> list[dict]:
    store = out / "store_ab"
    rows = []
    for e in effects:
        tag = EFFECTS[e][0]
        _git(repo, "checkout", "-q", tag)
        log = out / f"ab_{e}.log"
        before = set(runs_of(store)) if store.exists() else set()
        rc, _, wall = harness(repo, log, "ab", str(repo / "known_effect.yaml"), "--base", "e0",
                              "--store", str(store), *extra)
        if rc != 0:
            raise RuntimeError(f"ab at {tag} failed (exit {rc}); see {log}")
        base, head = ab_pair(store, set(runs_of(store)) - before)
        c = compare_json(repo, log, store, base, head)
        rows.append({"effect": e, "method": "ab", "base": base, "head": head, "wall_s": wall,
                     "triton": summarize(c["time"], "triton"),
                     "torch": summarize(c["time"], "torch"),
                     "not_same": details(store, (base, head), c["time"])})
    return rows


def run_r2r(repo: Path, out: Path, effects: list[str], extra: list[str]) -> list[dict]:
    store = out / "store_r2r"
    rows, first = [], None
    for tag in ["e0"] + [EFFECTS[e][0] for e in effects]:
        _git(repo, "checkout", "-q", tag)
        log = out / f"r2r_{tag}.log"
        before = set(runs_of(store)) if store.exists() else set()
        rc, _, wall = harness(repo, log, "run", str(repo / "known_effect.yaml"), "--store",
                              str(store), "--against", "none", *extra)
        if rc != 0:
            raise RuntimeError(f"run at {tag} failed (exit {rc}); see {log}")
        (run,) = sorted(set(runs_of(store)) - before)
        if first is None:
            first = run
            continue
        e = next(k for k, (t, _) in EFFECTS.items() if t == tag)
        c = compare_json(repo, log, store, first, run)
        rows.append({"effect": e, "method": "run-to-run", "base": first, "head": run,
                     "wall_s": wall, "triton": summarize(c["time"], "triton"),
                     "torch": summarize(c["time"], "torch"),
                     "not_same": details(store, (first, run), c["time"])})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("ab", "r2r", "both"))
    ap.add_argument("--effects", default="0,1,2,5", help="of 0,1,2,5 (percent)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "known_effect_out")
    ap.add_argument("--cpu", action="store_true", help="the smoke sweep on the CPU")
    ap.add_argument("--cases", default=None, help="--cases of ab/run (globs over case ids)")
    a = ap.parse_args(argv)
    effects = [e.strip() for e in a.effects.split(",") if e.strip()]
    bad = [e for e in effects if e not in EFFECTS]
    if bad:
        ap.error(f"--effects: {bad[0]!r} is not one of {', '.join(EFFECTS)}")
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    repo = out / "ke_repo"
    make_repo(repo, effects, timing={"rep_ms": 5, "warmup_ms": 1, "min_samples": 3}
              if a.cpu else None)
    extra = (["--device", "cpu", "--smoke"] if a.cpu else []) + (
        ["--cases", a.cases] if a.cases else [])
    t0 = time.monotonic()
    rows = []
    if a.mode in ("ab", "both"):
        rows += run_ab(repo, out, effects, extra)
    if a.mode in ("r2r", "both"):
        rows += run_r2r(repo, out, effects, extra)
    md = table(rows)
    (out / f"detection_{a.mode}.md").write_text(md)
    (out / f"detection_{a.mode}.json").write_text(json.dumps(rows, indent=2, default=_plain))
    print(md)
    print(f"wall {time.monotonic() - t0:.0f} s; stores and logs under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
