"""Which earlier run is this run's "before"? Pairing a run with its previous comparable run.

At the end of `run`, the previous comparable run in the same store is recorded in the manifest:

    against: {run_id, how: auto | explicit | none, why, path}      (run_id null: no pair; why says)

Comparable (auto): same experiment name and op, at least one case id in common, the same device
kind, GPU model, driver and clock limits (analysis.compare.env_problems), the same torch and
triton, status complete (or partial with timed results), created before this run; the most
recent such run wins. `run --against RUN` names the run instead (explicit), `--against none`
records that there is none.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from harness import store
from harness.errors import HarnessError, StoreError

SOFTWARE = ("torch", "triton")  # besides compare.env_problems' device, GPU, driver, clocks
NONE, AUTO = "none", "auto"


@dataclass(frozen=True)
class Against:
    run_id: str | None  # None: no earlier run to compare with (why says)
    how: str  # auto | explicit | none
    why: str
    path: str | None = None  # the run directory (explicit runs may live in another store)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> Against | None:
        if not isinstance(d, dict) or "how" not in d:
            return None
        return cls(d.get("run_id"), d["how"], d.get("why") or "", d.get("path"))


def request(ref: str | None, root: str | Path) -> Against | None:
    """`run --against`: None/`auto` (decided at the end of the run), `none`, or a run id/path
    (resolved now: a StoreError, exit 2, before anything is written)."""
    if ref is None or str(ref).strip().lower() == AUTO:
        return None
    if str(ref).strip().lower() == NONE:
        return Against(None, "none", "--against none")
    try:
        run_dir = store.resolve_run(ref, root)
    except StoreError as exc:
        raise StoreError(f"--against: {exc}; valid: a run id or run directory, auto, none") \
            from None
    return Against(run_dir.name, "explicit", f"--against {ref}", str(run_dir.resolve()))


def where(m: dict) -> str:
    env = m.get("env") or {}
    return env.get("gpu_name") or ("the CPU" if m.get("device") != "cuda" else "an unknown GPU")


def _has_timed_results(run_dir: Path) -> bool:
    res = store.load_results(run_dir)
    if "median_ms" not in res.columns:
        return False
    return any(v is not None and not math.isnan(float(v)) for v in res.median_ms)


def why_not(m: dict, other: dict, other_dir: Path, case_ids: set[str]) -> str | None:
    """Why `other` cannot be the previous run of the run with manifest `m` (None: it can).
    The reasons are short plural-friendly phrases, counted in the none-found message."""
    from harness.analysis.diff import env_problems

    exp, oexp = m.get("experiment") or {}, other.get("experiment") or {}
    if oexp.get("name") != exp.get("name") or oexp.get("op") != exp.get("op"):
        return "of another experiment"
    env, oenv = m.get("env") or {}, other.get("env") or {}
    if env_problems(oenv, env) or any(oenv.get(k) != env.get(k) for k in SOFTWARE):
        return "on another GPU, driver or software, or timed by another method"
    status = store.effective_status(other)
    if status not in ("complete", "partial"):
        return f"{status or 'without a status'}"
    try:
        if not _has_timed_results(other_dir):
            return "without timed results"
        if not case_ids & set(store.load_cases(other_dir).case_id):
            return "with no case in common"
    except StoreError:
        return "unreadable"
    return None


def find_previous(run_dir: str | Path) -> Against:
    """The most recent earlier comparable run in the run's store, or why there is none."""
    run_dir = Path(run_dir)
    m = store.load_manifest(run_dir)
    root = run_dir.parent
    rows = store.list_runs(root)
    names = [r["run_id"] for r in rows]
    earlier = rows[:names.index(run_dir.name)] if run_dir.name in names else rows
    case_ids = set(store.load_cases(run_dir).case_id)
    name = (m.get("experiment") or {}).get("name")
    reasons: dict[str, int] = {}
    for row in reversed(earlier):
        if row.get("error") or row.get("experiment") != name:
            continue
        try:
            other = store.load_manifest(row["path"])
        except HarnessError:
            continue
        why = why_not(m, other, Path(row["path"]), case_ids)
        if why is None:
            n = len(case_ids & set(store.load_cases(row["path"]).case_id))
            return Against(row["run_id"], "auto",
                           f"the latest earlier run of {name} on {where(m)} (same driver, "
                           f"torch, triton); {n} case{'s' if n != 1 else ''} in common",
                           str(Path(row["path"]).resolve()))
        reasons[why] = reasons.get(why, 0) + 1
    msg = f"no earlier run of {name} on {where(m)} in {root}/"
    if reasons:
        n = sum(reasons.values())
        msg += (f" ({n} earlier run{'s' if n != 1 else ''} of {name}: "
                + ", ".join(f"{v} {k}" for k, v in sorted(reasons.items(),
                                                          key=lambda kv: (-kv[1], kv[0])))
                + ")")
    return Against(None, "auto", msg)


def record(run_dir: str | Path) -> Against:
    """Store the run's pair in its manifest: an explicit/none request made at start is kept,
    otherwise the previous comparable run is found now."""
    m = store.load_manifest(run_dir)
    asked = Against.from_dict(m.get("against"))
    pair = asked if asked is not None and asked.how in ("explicit", "none") else \
        find_previous(run_dir)
    store.update_manifest(run_dir, against=pair.as_dict())
    return pair


def against_dir(run_dir: str | Path, pair: Against) -> Path:
    """The directory of the recorded previous run (StoreError when it is gone)."""
    for p in ([Path(pair.path)] if pair.path else []) + [Path(run_dir).parent / pair.run_id]:
        if (p / store.MANIFEST).exists():
            return p
    raise StoreError(f"run {pair.run_id} (this run's previous run) is no longer in "
                     f"{Path(run_dir).parent}/")
