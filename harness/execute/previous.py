"""What a run takes over from the previous run of its experiment, when nothing it depends on
changed: the kernel caches it can count on (compile-ahead skips those cases) and the Tuners'
launch-config picks (the check pass then times nothing it already timed).

    previous_medians(run_dir)             -> case_id -> the latest earlier run's median ms (the
        scheduler's longest-first estimate)
    previous_profile_s(run_dir, prof)     -> case_id -> seconds the case took under profiler
        `prof` in the latest earlier run that profiled (how the profiler passes are sharded)
    compiled_before(run_dir, impl_of, op) -> the cases whose kernels this host has compiled:
        the latest earlier run with the same kernel cache folders (still there), on this
        host with the same torch and triton, checked them with the same code
    inherit_picks(run_dir, op)            -> the previous run's id when its tuner_picks.json
        was copied in: same GPU model, driver, torch and triton, and every implementation the
        two runs share has the same code_hash (one edited kernel: everything is tuned again);
        `triton.autotune` picks are not copied (the autotuner chooses again)

Why keep picks: candidates within a few percent of each other trade places between processes
on an H200 (in a 280-case flash A/A pair the Tuner picked a different config for 8 cases, two
of them 8% slower), so a retune per run moves times that no code change moved; and in the loop
the picks of unchanged code cost check-pass time for nothing. `run --retune` tunes afresh.
"""
from __future__ import annotations

import math
import socket
from pathlib import Path

from harness import store
from harness.errors import HarnessError

GPU_KEYS = ("gpu_name", "driver", "torch", "triton")


def earlier_runs(run_dir: Path):
    """The other runs of the same experiment and device in the same store, newest first."""
    m = store.load_manifest(run_dir)
    name = (m.get("experiment") or {}).get("name")
    for row in reversed(store.list_runs(Path(run_dir).parent)):
        if row["run_id"] == Path(run_dir).name or row.get("error"):
            continue
        if row.get("experiment") == name and row.get("device") == m.get("device"):
            yield Path(row["path"])


def _previous(run_dir: Path, keys: tuple[str, ...]) -> Path | None:
    """The latest earlier run (earlier_runs) when its env agrees on `keys`, else None."""
    env = store.load_manifest(run_dir).get("env") or {}
    for prev in earlier_runs(run_dir):
        try:
            old_env = store.load_manifest(prev).get("env") or {}
        except HarnessError:
            return None
        return prev if all(old_env.get(k) == env.get(k) for k in keys) else None
    return None


def previous_medians(run_dir: Path) -> dict[str, float]:
    """case_id -> median ms in the latest earlier run that has medians (the scheduler's best
    estimate of what a case costs); {} when there is none."""
    for prev in earlier_runs(run_dir):
        try:
            res = store.load_results(prev)
        except HarnessError:
            continue
        if "median_ms" in res.columns and len(res):
            return {c: float(v) for c, v in zip(res.case_id, res.median_ms)
                    if v is not None and math.isfinite(float(v))}
    return {}


def previous_profile_s(run_dir: Path, prof: str) -> dict[str, float]:
    """case_id -> seconds under profiler `prof` (start to done in its worker, the first case
    of an implementation with its compile and warm-up) in the latest earlier run whose
    manifest has them; {} when there is none."""
    for prev in earlier_runs(run_dir):
        try:
            m = store.load_manifest(prev)
        except HarnessError:
            continue
        per = ((m.get("profiler_wall_s") or {}).get(prof) or {}).get("per_case_s")
        if per:
            return {c: float(v) for c, v in per.items()
                    if isinstance(v, (int, float)) and math.isfinite(v)}
    return {}


def _hashes(op, impls) -> dict[str, str | None]:
    from harness.tuning.provenance import code_hash

    out = {}
    for impl in impls:
        try:
            out[impl] = code_hash(op.get_impl(impl).fn)
        except Exception:  # no hash, no claim that the code is the same
            out[impl] = None
    return out


def _old_hashes(prev: Path) -> dict[str, str] | None:
    """case_id -> code_hash stored by the previous run (None: it stored none)."""
    try:
        res = store.load_results(prev)
    except HarnessError:
        return None
    if "code_hash" not in res.columns:
        return None
    return {c: h for c, h in zip(res.case_id, res.code_hash) if isinstance(h, str) and h}


def compiled_before(run_dir: Path, impl_of: dict[str, str], op) -> set[str]:
    """The cases of `impl_of` (case_id -> registered impl) whose kernels are already in this
    host's compile caches (see the module docstring)."""
    m = store.load_manifest(run_dir)
    env = m.get("env") or {}
    caches = m.get("kernel_caches")
    if env.get("hostname") != socket.gethostname() or not caches:
        return set()
    # fresh cache folders (TRITON_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR set elsewhere, a wiped
    # /tmp) hold nothing an earlier run compiled: on a two-H200 host a cold run with new
    # folders skipped compile-ahead for all 120 cases and compiled them in its check pass.
    # The latest earlier run that checked cases with these folders counts (one with other
    # folders in between did not touch them).
    if not all(_nonempty(d) for d in caches.values()):
        return set()
    before = None
    for run in earlier_runs(run_dir):
        try:
            old = store.load_manifest(run)
        except HarnessError:
            return set()
        if old.get("kernel_caches") != caches:
            continue
        old_env = old.get("env") or {}
        if any(old_env.get(k) != env.get(k) for k in ("torch", "triton", "hostname")):
            return set()
        before = _old_hashes(run)
        if before:  # a run that checked nothing compiled nothing: look further back
            break
    if not before:
        return set()
    now = _hashes(op, set(impl_of.values()))
    return {c for c, impl in impl_of.items()
            if now[impl] is not None and before.get(c) == now[impl]}


def _nonempty(folder: str) -> bool:
    try:
        return any(Path(folder).iterdir())
    except OSError:
        return False


def inherit_picks(run_dir: Path, op) -> str | None:
    """Copy the previous run's Tuner picks into `run_dir` when the code is unchanged (see the
    module docstring); returns that run's id, or None when nothing was copied."""
    from harness.execute.worker import _registered_impl

    if store.tuner_picks_path(run_dir).exists():  # a resumed run keeps its own
        return None
    prev = _previous(run_dir, GPU_KEYS)
    picks = store.load_tuner_picks(prev) if prev is not None else None
    before = _old_hashes(prev) if picks else None
    if not before:
        return None
    cases = store.load_cases(run_dir)
    prev_impl = {r.case_id: _registered_impl(r) for r in store.load_cases(prev).itertuples()}
    old: dict[str, set[str]] = {}
    for case, h in before.items():
        old.setdefault(prev_impl.get(case), set()).add(h)
    now = _hashes(op, {_registered_impl(r) for r in cases.itertuples()})
    shared = [i for i in now if i in old]
    if not shared or any(now[i] is None or old[i] != {now[i]} for i in shared):
        return None
    # a `triton.autotune` kernel chooses again in every run, as it does on its own (the since
    # block then says when it chose differently); the Tuners' picks are kept
    picks = {t: kept for t, by_key in picks.items()
             if (kept := {k: r for k, r in by_key.items() if r.get("source") != "autotune"})}
    if not picks:
        return None
    store.save_tuner_picks(run_dir, picks)
    return prev.name
