"""Compile-ahead: before the check pass of a GPU run, a few worker processes call each case of
the implementations that JIT-compile (Triton kernels, torch.compile) once, side by side, so
that the check pass finds Triton's and Inductor's on-disk caches warm instead of compiling one
kernel variant after another on one core.

Nothing they do is a measurement: the Tuners compile every candidate and time none
(harness.tuning.compile_only), the workers store no pick, and each keeps to its share of GPU
memory (a case that does not fit is simply compiled later by the check pass). It is best
effort: a worker that fails, crashes or outlives a case's watchdog limit ends its share of the
warm-up; the check pass then meets the same case and records the fault properly.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

from harness import store
from harness.execute import sharing
from harness.execute.executors.process import (CaseWatch, run_threads, stream, todo, worker_argv,
                                       worker_env)
from harness.execute.executors.schedule import (compile_workers, non_size_values, warm_plans,
                                                warm_shards, workers_per_gpu)

MEMORY_SHARE = 0.9  # of a GPU's memory, split between the compile-ahead workers it hosts
# check lanes per GPU beside compile-ahead: one lane was the compile phase's critical path in
# flash_bwd.yaml (H100, 2026-11-26: 160 cases checked in 41.9 s, compile-ahead done in 24.0 s;
# naive's references keep the GPU busy while sdpa_cudnn builds its plans on the CPU)
BESIDE_LANES = 2


def compile_ahead(run_dir: Path, case_ids: list[str], *, device: str,
                  limits: dict[str, float], gpus: list[int | None],
                  on_event: Callable[[dict], None], workers: int | None = None,
                  stop: threading.Event | None = None,
                  units: dict[str, tuple[object, str | None]] | None = None,
                  gpu_mib: float | None = None) -> dict:
    """Warm `case_ids` (check order) over `workers` processes spread over `gpus` (by default
    compile_workers: the host's cores, the GPUs and `gpu_mib`, one GPU's memory, else the
    run's env's); `units` ({case: (compile class, backend)}, compile_units) keeps a class in
    one worker. Returns {"workers": n, "cases": n, "wall_s": s} (workers 0: nothing was run)."""
    run_dir = Path(run_dir)
    ids = todo(run_dir, "warm", case_ids)
    n_gpus = len(gpus) if gpus else 1
    if gpu_mib is None:  # `run` passes its own; `ab` compiles ahead into the runs it made
        gpu_mib = (store.load_manifest(run_dir).get("env") or {}).get("gpu_memory_mib")
    n = (compile_workers(os.cpu_count(), len(ids), n_gpus, gpu_mib) if workers is None
         else min(workers, len(ids)))
    if n < 1:
        return {"workers": 0, "cases": 0, "wall_s": 0.0}
    units = units or {}
    unit_of = {c: u for c, (u, _) in units.items()}
    backend_of = {c: b for c, (_, b) in units.items()}
    shards = warm_shards(ids, n, unit_of, backend_of)
    plans = warm_plans(shards, unit_of, backend_of)
    # the claims of classes (work stealing, warm_plans): {case: class number} and a file per
    # claimed class, in a folder of the run's own
    claims = sharing.folder(run_dir, "warm")
    sharing.Claims.write(claims, {c: unit_of.get(c, ("case", c)) for c in ids})
    frac = MEMORY_SHARE / workers_per_gpu(len(shards), n_gpus)
    t0 = time.monotonic()
    lane = _Lanes(run_dir, limits, on_event, stop)

    def one(i: int, shard_ids: list[str]) -> None:
        gpu = gpus[i % len(gpus)] if gpus else None
        env = {**worker_env(device, gpu), "HARNESS_WARM_MEMORY_FRACTION": f"{frac:.3f}"}
        lane(f"warm{i}", gpu, env, worker_argv(run_dir, "warm", device, shard_ids,
                                               shard=f"warm{i}") + ["--claims", str(claims)])

    try:
        run_threads([threading.Thread(target=one, args=(i, s), name=f"warm{i}", daemon=True)
                     for i, s in enumerate(plans)], lane.stop)
    finally:
        sharing.clear(run_dir, "warm")
    return {"workers": len(shards), "cases": len(ids), "wall_s": round(time.monotonic() - t0, 2)}


def check_beside(run_dir: Path, case_ids: list[str], *, device: str,
                 limits: dict[str, float], gpus: list[int | None],
                 on_event: Callable[[dict], None],
                 stop: threading.Event | None = None) -> dict:
    """Check `case_ids` (cases that compile nothing: check_beside_cases) while compile-ahead
    runs, BESIDE_LANES workers per GPU (`--ahead`; no more than there are shapes), so the GPU
    is not idle while the CPU compiles. The lanes take whole shapes as they come free: each
    walks every case in check order and checks a shape's cases only if it claims the shape
    first (sharing.Claims, compile-ahead's work stealing). A shape's implementations share
    its inputs and references (correctness.ReferenceCache), computed once in one process; a
    cost estimate had dealt one lane 30 s of checks and the other 20 s (FLOPs halve for a
    causal shape, naive attention's work does not).
    Each case holds the GPU's lock shared (harness.tuning.gpu_lock), so the check pass's
    Tuners, timing candidates meanwhile (harness.execute.compile_phase), have it to themselves.
    Nothing is timed beside compile-ahead, and what would be is left alone: a case whose check
    raised (out of the memory the compile-ahead workers hold, say) or timed a Tuner gets no
    record, nor does one whose worker died or hung, and the check pass does it afterwards as
    it would have. Returns {"workers": n, "cases": n, "checked": n, "wall_s": s}."""
    from harness.tuning import gpu_lock

    run_dir = Path(run_dir)
    ids = todo(run_dir, "check", case_ids)
    if not ids:
        return {"workers": 0, "cases": 0, "checked": 0, "wall_s": 0.0}
    shape_of = store.shapes(run_dir)
    unit_of = {c: shape_of.get(c) or c for c in ids}
    lanes = [g for _ in range(BESIDE_LANES) for g in (gpus or [None])][:len(set(unit_of.values()))]
    claims = sharing.folder(run_dir, "beside")
    sharing.Claims.write(claims, unit_of)
    t0 = time.monotonic()
    lane = _Lanes(run_dir, limits, on_event, stop)

    def one(i: int, gpu) -> None:  # each case with the GPU lock shared (Worker._one)
        env = {**worker_env(device, gpu), gpu_lock.ENV: sharing.lock_path(run_dir, gpu)}
        lane(f"beside{i}", gpu, env,
             worker_argv(run_dir, "check", device, ids, shard=f"beside{i}")
             + ["--ahead", "--claims", str(claims)])

    try:
        run_threads([threading.Thread(target=one, args=(i, g), name=f"beside{i}", daemon=True)
                     for i, g in enumerate(lanes)], lane.stop)
    finally:
        sharing.clear(run_dir, "beside")
    done = len(ids) - len(todo(run_dir, "check", ids))
    return {"workers": len(lanes), "cases": len(ids), "checked": done,
            "wall_s": round(time.monotonic() - t0, 2)}


class _Lanes:
    """One best-effort worker process per call (`lane(name, gpu, env, argv)`), its log
    raw/logs/<name>.log, its events passed on with its GPU (one at a time), its case watched:
    whatever its exit, the check pass decides what it left."""

    def __init__(self, run_dir: Path, limits: dict[str, float],
                 on_event: Callable[[dict], None], stop: threading.Event | None):
        self.run_dir, self.limits, self.on_event = run_dir, limits, on_event
        self.stop = stop or threading.Event()
        self.lock = threading.Lock()

    def __call__(self, name: str, gpu, env: dict, argv: list[str]) -> None:
        watch = CaseWatch(self.limits, self.stop)

        def on_ev(ev):
            watch.see(ev)
            with self.lock:
                self.on_event({**ev, "gpu": gpu})

        stream(argv, env, store.raw_dir(self.run_dir, "logs") / f"{name}.log", on_ev,
               watchdog=watch.expired)


def check_beside_cases(run_dir: Path, op, check_ids: list[str]) -> list[str]:
    """The check-pass cases of implementations that compile nothing (not WARM_BACKENDS), in
    check order: checked beside compile-ahead (check_beside)."""
    from harness.execute.worker import WARM_BACKENDS, _registered_impl, impl_backend

    base = {r.case_id: _registered_impl(r) for r in store.load_cases(run_dir).itertuples()}
    return [c for c in check_ids if impl_backend(op, base.get(c)) not in WARM_BACKENDS]


def compile_units(run_dir: Path, op, case_ids: list[str]) -> dict[str, tuple[object, str | None]]:
    """{case: (compile class, backend)}: a case's class is its implementation, dtype, forced
    config and the values of the op's params that are not sizes (Param.size), i.e. the cases
    that run the same compiled kernels, keyed (implementation, forced config, those values,
    dtype): schedule.warm_shards reads the implementation first; the backend is its
    implementation's."""
    from harness.execute.worker import _registered_impl, impl_backend

    size = {p.name for p in op.params if p.size}
    keep = set(case_ids)
    out: dict[str, tuple[object, str | None]] = {}
    for r in store.load_cases(run_dir).itertuples():
        if r.case_id not in keep:
            continue
        forced = getattr(r, "forced_config", None)
        key = (r.impl, forced if isinstance(forced, str) else "",
               non_size_values(r.params, size), r.dtype)
        out[r.case_id] = (key, impl_backend(op, _registered_impl(r)))
    return out


def warm_cases(run_dir: Path, op, check_ids: list[str],
               this_host: bool = True) -> tuple[list[str], int]:
    """The check-pass cases worth compiling ahead, in check order: those of implementations that
    JIT-compile (WARM_BACKENDS), less the ones this host already compiled for the previous run
    of the same code (harness.execute.previous.compiled_before; not when the cases run on other
    hosts, `this_host` False); and how many of those were left out."""
    from harness.execute.previous import compiled_before
    from harness.execute.worker import WARM_BACKENDS, _registered_impl, impl_backend

    base = {r.case_id: _registered_impl(r) for r in store.load_cases(run_dir).itertuples()}
    ids = [c for c in check_ids if impl_backend(op, base.get(c)) in WARM_BACKENDS]
    cached = compiled_before(run_dir, {c: base[c] for c in ids}, op) if this_host else set()
    return [c for c in ids if c not in cached], len(cached)
