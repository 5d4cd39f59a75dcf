"""A waiting worker's untimed first calls (`worker --prewarm`), and what each one cost.

A process started ahead of its turn (the time pass's later process, a profiler process) calls
once each case that loads something on its first call in a process (PREWARM_BACKENDS:
torch.compile graphs traced, compiled kernels loaded, a library's plans made), torch.compile's
first: so that its timing or profiling starts warm. An eager torch case loads nothing per case;
calling it would only take the GPU from the process it runs beside. Tuners and autotuners
compile and time nothing (harness.tuning.compile_only), nothing of the call is kept, and each
call holds the GPU lock shared (it waits while another process times). Best effort: a call that
fails is the time pass's to record.

Each call's seconds (from the lock's grant to the synchronised end: loading, not waiting) go to
parts/load[.<shard>].jsonl, `{case_id, load_s, status}`: what that case costs a fresh process
before its first useful call. The profiler passes' planner weighs a GPU's share with them
(ProfilerPasses._joint_shards): on two GPUs, an nsys process given torch.compile's 40 cases spent
8-10 s loading their graphs after its turn, while the other GPU's profilers had ended.
"""
from __future__ import annotations

import time
import traceback
from contextlib import nullcontext
from typing import Callable

from harness import store

LOAD_PART = "load"
# what loads something on its first call in a process, costliest first
PREWARM_BACKENDS = ("compile", "library", "triton")
BESIDE_BACKENDS = ("compile",)  # what a waiting process loads while the compile phase runs


def prewarm(worker, only: list[str] | None, shard: str | None, emit: Callable,
            backend_of: Callable[[str], str | None], gate=None) -> None:
    """`worker` (a harness.execute.worker.Worker) calls each of `only` (its cases if None)
    whose implementation's backend (`backend_of`) loads something, once, untimed; records
    each call's load seconds; `emit` is the worker's progress line (start/done, `prewarm`).

    `gate` (sharing.AheadGate: the time pass's later process, started while the compile
    phase runs): the torch.compile cases (BESIDE_BACKENDS) each once compile-ahead has built
    it (its warm record), while the phase still runs, nothing of it timed (gpu_lock.held_off);
    a call that would have timed or ran out of memory beside the phase is made again after
    it, and so are the other backends' (short calls, whose seconds beside the phase would
    mislead the profilers' planner: a cuDNN case's took 0.25 s there, 0.07 s after). Loaded
    after the phase, the torch.compile graphs (~0.25 s each) held the GPU lock shared while
    the check pass's Tuners waited to time: 6.2-9.9 s of waiting per flash.yaml run on H100s,
    0.1-1.4 s with them loaded beside the phase."""
    cases = {c[0]: c for c in worker.cases}
    order = [c for c in (only if only is not None else list(cases)) if c in cases]
    backend = {c: backend_of(cases[c][1]) for c in order}
    order = sorted((c for c in order if backend[c] in PREWARM_BACKENDS),
                   key=lambda c: PREWARM_BACKENDS.index(backend[c]))
    later = []
    if gate is not None and not gate.over():
        beside = [c for c in order if backend[c] in BESIDE_BACKENDS]
        for case_id in gate.loadable(beside):  # (each once it is built)
            if not _load(worker, cases[case_id], shard, emit, beside=not gate.over()):
                later.append(case_id)
        gate.wait()
        order = later + [c for c in order if backend[c] not in BESIDE_BACKENDS]
    for case_id in order:
        _load(worker, cases[case_id], shard, emit)


def _load(worker, case: tuple, shard: str | None, emit: Callable, beside: bool = False) -> bool:
    """One untimed first call of `case`; False when made `beside` the compile phase and it
    would have timed something or ran out of memory there (nothing recorded: again later)."""
    from harness import tuning
    from harness.execute.sharing import out_of_memory
    from harness.tuning import gpu_lock
    from harness.tuning.autotune import steering

    case_id, impl_name, params, dtype = case
    emit("start", name="prewarm", case_id=case_id)
    status, load_s, again = "ok", None, False
    try:
        impl = worker.op.get_impl(impl_name)
        if impl.reason_unavailable(params, dtype, worker.device) is None:
            forced = impl.split_config(worker.forced.get(case_id) or {})
            with gpu_lock.held_off() if beside else nullcontext(), gpu_lock.shared(), \
                    tuning.forcing(forced), tuning.compile_only(), steering(impl):
                began = time.perf_counter()
                fn, _ = worker._prepare(impl, params, dtype, case_id)
                fn()
                worker._sync()
                load_s = time.perf_counter() - began
                fn = None
    except Exception as exc:
        again = beside and (isinstance(exc, gpu_lock.TimingDeferred) or out_of_memory(exc))
        if not again:
            traceback.print_exc()
            status = "error"
    fn = None  # (its inputs go back below, the exception's frames gone)
    tuning.take_new_picks()
    worker._release(collect=again)
    if again:
        emit("done", name="prewarm", case_id=case_id, status="deferred")
        return False
    if load_s is not None:
        try:
            store.append_part(worker.run_dir, LOAD_PART, {
                "case_id": case_id, "load_s": round(load_s, 4), "status": status},
                shard=shard)
        except OSError:  # a record of what loading cost is not worth failing the process
            traceback.print_exc()
    emit("done", name="prewarm", case_id=case_id, status=status)
    return True


def load_seconds(run_dir) -> dict[str, float]:
    """case_id -> what its first call cost a fresh process of this run (the latest record)."""
    return {r["case_id"]: float(r["load_s"]) for r in store.read_parts(run_dir, LOAD_PART)
            if isinstance(r.get("load_s"), (int, float))}
