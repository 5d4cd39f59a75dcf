"""The process that touches the device: `python -m harness worker --run DIR --passes check,time`.

The runner (and, for profiler passes, ncu/nsys) starts it. It reads the cases from the run
directory, does each (pass, case) not yet recorded, and appends one record per (pass, case) to
`parts/<pass>.jsonl` as it goes, so a crash loses at most the case in flight. Progress goes to
stdout as `@@harness {json}` lines; everything else on stdout/stderr is the log.

Passes
  check           correctness vs the reference (fresh inputs, NaN-poisoned outputs)
  time            timing samples + peak memory
  profile         warm-up (compile, autotune) outside any range, then exactly one call inside an
                  NVTX push/pop range of domain `harness` named for the case id; ncu and nsys
                  wrap this pass
  torch_profiler  the same single call under torch.profiler (the nsys fallback)
  ab              `harness ab` (harness.execute.ab_worker): the head run's worker checks and
                  times both versions of each case, interleaved, recording into both runs of
                  the pair
  warm            compile-ahead (GPU runs, before check): one call of each case of an impl
                  that compiles (backend triton or compile) with the Tuners compiling every
                  candidate and timing none (harness.tuning.compile_only); its only product is
                  the on-disk kernel caches (Triton, Inductor), its records only say what it did

Launch configurations (harness.tuning): a case of a configured candidate runs with its tunables
forced (a Tuner's, or a `triton.autotune` kernel's: harness.tuning.autotune.steering); the picks of
every check/time call are logged and stored with the record (config, config_source), with the
impl's code_hash and, on the GPU, the compiled kernels' registers/spills/shared memory (time
pass, the second call of a case, before its samples). Picks the Tuners (and autotuners) time
are persisted in the run dir (store.save_tuner_picks) and loaded by every later worker.
"""
from __future__ import annotations

import gc
import json
import os
import time
import traceback
import zlib
from contextlib import nullcontext
from pathlib import Path

from harness.errors import exception_line
from harness.execute import sharing
from harness.execute.touch import set_up_beside, touch
from harness.machine.env import gpu_state

EXIT_CONTEXT_DEAD = 3
PASSES = ("check", "time", "profile", "torch_profiler", "warm", "ab")
WARM_BACKENDS = ("triton", "compile")  # what JIT-compiles on its first call
WARM_MEMORY_FRACTION_ENV = "HARNESS_WARM_MEMORY_FRACTION"
NVTX_DOMAIN = "harness"
CPU_REP_MS = 200.0  # the time pass's budget per case on the CPU
RELEASE_BYTES = 1 << 30  # cached GPU memory a process sharing the GPU hands back (_release)


def emit(event: str, **fields) -> None:
    print("@@harness " + json.dumps({"event": event, **fields}, default=str), flush=True)


def shape_key(params: dict, dtype: str) -> str:
    """The implementation-free identity of a case (its parameters and dtype)."""
    return json.dumps(dict(params), sort_keys=True, default=str) + dtype


def case_seed(run_seed: int, case_id: str) -> int:
    return (run_seed + zlib.crc32(case_id.encode())) % (2 ** 31)


def timed_seed(case_id: str) -> int:
    """The seed of the inputs a case is timed (and profiled) on: the case's own, not the run's,
    so every run, every process of the time pass and `ab` time the same data, and two runs
    differ only by what differs between processes, which each case's between-process spread
    measures. (The check pass draws fresh inputs each run: case_seed of the run's seed.)"""
    return case_seed(0, case_id) + 1


class Worker:
    def __init__(self, run_dir: Path, device: str):
        from harness import store
        from harness.experiment import spec
        from harness.execute.code_tree import op_for
        from harness.registry import Params

        self.run_dir = Path(run_dir)
        self.device = device
        self.manifest = store.load_manifest(self.run_dir)
        self.exp = spec.Experiment.model_validate(self.manifest["experiment"])
        self.op = op_for(self.manifest)  # a `harness ab` base run: its commit's op
        self.seed = int(self.manifest.get("seed", 0))
        cases = store.load_cases(self.run_dir)
        self.cases = [
            (r.case_id, _registered_impl(r), Params(json.loads(r.params)), r.dtype)
            for r in cases.itertuples()
        ]
        self.forced = {r.case_id: _forced_config(r) for r in cases.itertuples()}
        self.flusher = None
        self.ref_cache = None
        self.code_hashes: dict[str, str] = {}
        self.warm_share: float | None = None  # the warm pass's share of GPU memory
        self.ahead = False  # a check beside compile-ahead (run's `ahead`)
        self.process = 0  # which of the time pass's processes this is (0: the first)
        self.processes = store.time_processes(self.run_dir)  # how many there are
        from harness import tuning

        tuning.load_picks(store.load_tuner_picks(self.run_dir))

    # -- helpers -----------------------------------------------------------------------------
    def _prepare(self, impl, params, dtype, case_id):
        """Fresh inputs, an output buffer, and the bound zero-argument call."""
        import torch

        from harness.execute.correctness import TORCH_DTYPES

        gen = torch.Generator(device=self.device)
        gen.manual_seed(timed_seed(case_id))
        inputs = self.op.make_inputs(params, TORCH_DTYPES[dtype], self.device, gen)
        out = self.op.make_out(inputs, params) if impl.accepts_out else None
        fn = self.op.bind_impl(impl, inputs, params, out)
        nbytes = sum(t.numel() * t.element_size() for t in (*inputs, out)
                     if isinstance(t, torch.Tensor))
        return fn, nbytes

    def _sync(self):
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    # -- passes ------------------------------------------------------------------------------
    def do_check(self, impl, params, dtype, case_id) -> dict:
        from harness.execute.correctness import check

        opts = self.exp.correctness
        if not opts.enabled:
            return {"status": "ok", "correct": None, "error": None,
                    "expected_kernels": impl.kernels_expected(params)}
        from harness.execute import correctness

        ref0 = correctness.REF_SECONDS[0]
        if self.ref_cache is None:
            self.ref_cache = correctness.ReferenceCache()
        # one seed per shape: all implementations of a shape see the same fresh inputs, and the
        # reference is computed once for them (fresh again in the next run: the run seed differs)
        res = check(self.op, impl, params, dtype, self.device, trials=opts.trials,
                    seed=case_seed(self.seed, shape_key(params, dtype)),
                    tol_factor=opts.tol_factor, cache=self.ref_cache)
        ref_s = round(correctness.REF_SECONDS[0] - ref0, 3)
        # what the code measured declares, kept with the run (the code may change later)
        return {"status": "ok" if res.correct else "failed", **res.as_dict(),
                "expected_kernels": impl.kernels_expected(params), "ref_s": ref_s}

    def do_time(self, impl, params, dtype, case_id) -> dict:
        """This process's share of the case's timing (timing.share: the budget of
        `timing.processes` processes split between them). The first process also records
        the peak memory and what was compiled; a repeat (`--tag time_p2`, ...) only samples."""
        from harness.execute import timing
        from harness.tuning.provenance import compiled_record

        t = self.exp.timing
        n = self.processes
        part = timing.share(n, warmup_ms=t.warmup_ms, rep_ms=t.rep_ms,
                            min_samples=t.min_samples, max_samples=t.max_samples,
                            max_rel_err=t.max_rel_err)
        fn, nbytes = self._prepare(impl, params, dtype, case_id)
        compiled = None
        if self.device == "cuda":
            if self.flusher is None:
                self.flusher = timing.Flusher("cuda", t.flush_l2)
            peak = called_ms = None
            if not self.process:  # bench's first call; what compiled from a second call
                peak, called_ms = timing.first_call(fn, nbytes)
                compiled = compiled_record(fn, impl.fn, self._sync)
            samples = timing.bench(fn, device="cuda", **part, flush_l2=t.flush_l2,
                                   cuda_graph=t.cuda_graph, host_overhead=t.host_overhead,
                                   flusher=self.flusher, clock_probe=self._clock_probe(),
                                   called_ms=called_ms)
        else:  # interpreter / CPU: a few wall-clock samples, labelled as such (never judged:
            # an interpreted kernel's seconds say nothing of its GPU time, so one warm-up call
            # and two samples for a slow one, more within 200 ms for a fast one)
            peak = None
            samples = timing.bench(fn, device="cpu", warmup_ms=1e-3,
                                   rep_ms=min(t.rep_ms, CPU_REP_MS) / n, min_samples=2,
                                   max_samples=part["max_samples"],
                                   max_rel_err=part["max_rel_err"])
        rec = {"status": "ok", "samples": list(samples.ms), "peak_mem_bytes": peak,
               "process": self.process, **samples.summary()}
        if self.process:  # a repeat: the first process's record keeps the provenance
            return rec
        rec.update(compiled if compiled is not None else {"compiled": []})  # interpreter: none
        return rec

    def _warm_then_range(self, impl, params, dtype, case_id, inside):
        """Warm up outside any range (JIT, autotune, cudnn plans), then one call inside, with
        the GPU to this process (harness.tuning.gpu_lock: the next profiler process may be
        making its first calls meanwhile, ProfilerPasses._run_in_turn)."""
        import nvtx

        from harness.tuning import gpu_lock

        fn, _ = self._prepare(impl, params, dtype, case_id)
        for _ in range(3):
            fn()
        self._sync()
        with gpu_lock.exclusive():
            nvtx.push_range(message=case_id, domain=NVTX_DOMAIN)
            try:
                result = inside(fn)
                self._sync()
            finally:
                nvtx.pop_range(domain=NVTX_DOMAIN)
        return result

    def do_warm(self, impl, params, dtype, case_id) -> dict:
        if impl.backend not in WARM_BACKENDS:
            return {"status": "skipped", "error": f"backend {impl.backend}: nothing to compile"}
        from harness import tuning

        if self.device == "cuda" and self.warm_share is None:
            import torch  # several warmers share the GPU: each keeps to its share of memory

            self.warm_share = float(os.environ.get(WARM_MEMORY_FRACTION_ENV, "0") or 0)
            if 0 < self.warm_share < 1:
                torch.cuda.set_per_process_memory_fraction(self.warm_share)
        shared, alone = 0 < (self.warm_share or 0) < 1, False
        for attempt in (0, 1, 2):
            # out of its share: once more, the cache handed back and the whole memory taken,
            # beside the other workers where the GPU has room, else (or out again) alone
            whole = attempt and shared
            try:
                with sharing.whole_memory(self.run_dir, self.warm_share, alone=alone) if whole \
                        else nullcontext():
                    with tuning.compile_only():  # the binder's set-up calls too
                        fn, _ = self._prepare(impl, params, dtype, case_id)
                        fn()
                    self._sync()
                    fn = None
                return {"status": "ok"}
            except Exception as exc:
                if type(exc).__name__ != "OutOfMemoryError" or attempt and (alone or not whole):
                    raise
                alone = bool(attempt) or (shared and not sharing.room_for(exc))
            fn = None
            self._release()  # what the failed call cached goes back (garbage collected first)
        raise AssertionError("unreachable")

    def _clock_probe(self):
        """An NVML reading of this worker's GPU's SM clock (None without NVML)."""
        from harness.machine import nvml

        index = _gpu_index()
        return lambda: nvml.sm_clock(0 if index is None else index)

    def do_profile(self, impl, params, dtype, case_id) -> dict:
        self._warm_then_range(impl, params, dtype, case_id, lambda fn: fn())
        return {"status": "ok"}

    def do_torch_profiler(self, impl, params, dtype, case_id) -> dict:
        from harness.profilers.torch_profiler import profile_call

        kernels = self._warm_then_range(impl, params, dtype, case_id,
                                        lambda fn: profile_call(fn, self.device))
        return {"status": "ok", "kernels": kernels}

    # -- loop ----------------------------------------------------------------------------------
    def where(self) -> dict:
        """Which GPU of which host ran the case, and that GPU's state (name, clocks, temperature)
        read through NVML, or nvidia-smi without it (never with CUDA: the worker may be wrapped
        by ncu)."""
        import socket

        out = {"host": socket.gethostname(), "gpu": _gpu_index()}
        if self.device == "cuda":
            out.update(gpu_state(out["gpu"] if out["gpu"] is not None else 0))
        return out

    def run(self, passes: list[str], only: list[str] | None, tag: str | None = None,
            shard: str | None = None, *, ahead: bool = False, prewarm: bool = False,
            wait_for: str | None = None, claims: str | None = None,
            load_after: str | None = None) -> int:
        """Do every (pass, case) without a record; records go to parts/<tag or pass>.jsonl
        (parts/<pass>.<shard>.jsonl when several workers run at once).

        `ahead` (a check beside compile-ahead): best effort, a case whose check raised or
        timed a Tuner gets no record (the check pass does it again, alone). Started ahead of
        its turn (`prewarm` or `wait_for`), a worker first sets up what launches no kernel
        (touch; then its `ready` event), waits for `load_after` (a profiler process started
        while the time pass times), calls each case once untimed (`prewarm`), then waits for
        `wait_for`, whose JSON case ids replace `only`
        (harness.execute.executors.process.run_shard). `claims`
        (units.json, {case: class}): a case is done only if its class is this worker's or can
        be claimed for it (compile-ahead's work stealing: sharing.Claims)."""
        from harness import store, tuning
        from harness.tuning import gpu_lock

        self.process, self.ahead = store.repeat_index(tag), ahead
        backends = {impl_backend(self.op, c[1]) for c in self.cases}
        if prewarm or wait_for:  # a check worker beside compile-ahead: CUDA if it fits
            early_check = "check" in passes and not prewarm
            touch(self.device, backends, turn=wait_for if early_check else None,
                  gpu=_gpu_index())
            emit("ready")  # set up: a turn that came before waited for it (ProfilerPass)
        # the check and time passes' workers, turned while the compile phase still runs
        gate = (sharing.AheadGate.open(self.run_dir) if not ahead
                and {"check", "time"} & set(passes) else None)
        if prewarm:
            if load_after:
                sharing.wait_turn(load_after)
            self.prewarm(only, shard, gate)  # beside the compile phase: what it has built
        # the check and time passes' workers are the driver's own children (not a profiler's)
        only = (self.wait_turn(wait_for, watch_parent=bool({"check", "time"} & set(passes)))
                if wait_for else only)
        claim = sharing.Claims(claims) if claims else None
        tuning.take_new_picks()  # picks timed before this loop are no case's of it
        for pass_name in passes:
            part = tag or pass_name
            if gate is not None and pass_name != "check":
                gate.wait()  # nothing is timed beside the compile phase
            done = {r["case_id"]: r for r in store.read_parts(self.run_dir, part)}
            check_parts = {r["case_id"]: r for r in store.read_parts(self.run_dir, "check")}
            todo = [c for c in self.cases if c[0] not in done and (only is None or c[0] in only)]
            if only is not None:  # the order the scheduler gave (longest first)
                rank = {c: i for i, c in enumerate(only)}
                todo.sort(key=lambda c: rank.get(c[0], 0))
            emit("pass", name=part, total=len(todo))
            gated = gate is not None and pass_name == "check" and not gate.over()
            if gated:  # CUDA set up while compile-ahead builds the first classes
                set_up_beside(self.device, backends, gate, _gpu_index())
            for item in gate.walk(todo) if gated else todo:
                case_id, impl_name, params, dtype = item
                if claim is not None and not claim.take(case_id):
                    continue  # its class is another worker's (compile-ahead's work stealing)
                emit("start", name=part, case_id=case_id)
                began = time.perf_counter()
                beside = gated and not gate.over()  # nothing timed while compile-ahead runs
                with gpu_lock.held_off() if beside and not gate.over("warm") else nullcontext():
                    rec = self._one(pass_name, case_id, impl_name, params, dtype, check_parts)
                if (pass_name == "warm" or ahead or beside) and not rec.get("context_dead"):
                    # beside one another: what the allocator caches goes back (a check lane
                    # held 37 GiB after naive's backward at N=16384, compile-ahead ran out)
                    self._release(collect=False)
                until = gate.held_back(rec) if beside else None
                if until is not None:  # again once compile-ahead (or the whole phase) is over
                    gate.defer(item, case_id, until)
                    tuning.take_new_picks()
                    emit("done", name=part, case_id=case_id, status="deferred")
                    continue
                # beside other work, a pick timed (new picks) is not kept, nor is an error
                if ahead and (tuning.take_new_picks() or rec["status"] == "error"):
                    emit("done", name=part, case_id=case_id, status="deferred")
                    if rec.get("context_dead"):
                        return EXIT_CONTEXT_DEAD
                    continue
                rec["wall_s"] = round(time.perf_counter() - began, 3)
                if pass_name in ("check", "time"):
                    rec.update(self.where())
                if pass_name == "warm":  # compile-ahead picks nothing for later passes
                    tuning.take_new_picks()
                else:
                    store.save_tuner_picks(self.run_dir, tuning.take_new_picks(), shard=shard)
                store.append_part(self.run_dir, part, {"case_id": case_id, **rec}, shard=shard)
                emit("done", name=part, case_id=case_id, status=rec["status"])
                if rec.get("context_dead"):
                    return EXIT_CONTEXT_DEAD
            if pass_name in ("profile", "torch_profiler"):  # the GPU's next profiler process
                self._release()  # takes its turn at `end`: what this one cached goes back first
                emit("end", name=part)
        return 0

    def prewarm(self, only: list[str] | None, shard: str | None = None, gate=None) -> None:
        """One untimed call of each case that loads something (harness.execute.prewarm)."""
        from harness.execute.prewarm import prewarm

        prewarm(self, only, shard, emit, lambda impl_name: impl_backend(self.op, impl_name),
                gate)

    def _release(self, collect: bool = True) -> None:
        """Hand the last case's memory back to the GPU (another process shares it): torch's
        cached blocks, when more than RELEASE_BYTES (emptying a small cache costs more than it
        frees); `collect` first collects garbage (cycles holding tensors), which takes long
        with torch, Triton and Inductor loaded: the prewarm loop (no cycles) skips it."""
        if collect:
            gc.collect()
        if self.device == "cuda":
            import torch

            if torch.cuda.memory_reserved() - torch.cuda.memory_allocated() > RELEASE_BYTES:
                torch.cuda.empty_cache()

    def wait_turn(self, path: str, watch_parent: bool = False) -> list[str]:
        """Wait for this process's turn (sharing.wait_turn): the case ids it does now. The
        picks the first process made meanwhile are loaded."""
        from harness import store, tuning

        ids = sharing.wait_turn(path, watch_parent=watch_parent)
        tuning.load_picks(store.load_tuner_picks(self.run_dir))
        return ids

    def _one(self, pass_name, case_id, impl_name, params, dtype, check_parts) -> dict:
        impl = self.op.get_impl(impl_name)
        reason = impl.reason_unavailable(params, dtype, self.device)
        if reason:
            return {"status": "skipped", "error": reason}
        prior = check_parts.get(case_id)
        if pass_name != "check" and prior and prior["status"] in ("error", "skipped", "timeout"):
            return {"status": "skipped", "error": f"check: {prior.get('error')}"}
        from harness import tuning
        from harness.tuning import gpu_lock
        from harness.tuning.autotune import steering

        handler = getattr(self, f"do_{pass_name}")
        alone = pass_name == "time"  # timed: nothing else of the run on this GPU meanwhile
        for attempt in (0, 1):
            try:
                forced = impl.split_config(self.forced.get(case_id) or {})
                # a check beside compile-ahead holds off a check worker's Tuner timing
                with (gpu_lock.exclusive() if alone else gpu_lock.shared() if self.ahead
                      else nullcontext()), \
                        tuning.forcing(forced), tuning.recording() as log, steering(impl):
                    rec = handler(impl, params, dtype, case_id)
                break
            except Exception as exc:  # a failing kernel fails its case, not the run
                if not isinstance(exc, gpu_lock.TimingDeferred):  # (deferred, not failed)
                    traceback.print_exc()
                if not attempt and not alone and gpu_lock.path() and sharing.out_of_memory(exc):
                    # another process of the run shares this GPU (gpu_lock): the case is not
                    # failed for memory that process held; once more with the GPU to itself
                    self._release()
                    alone = True
                    continue
                return {"status": "error", "error": exception_line(exc, 500),
                        "context_dead": self._context_dead(exc)}
        if pass_name in ("check", "time"):
            rec.update(self._provenance(impl, log))
            if log.compile_s or log.timing_s:  # the harness's own cost, kept to be profiled
                rec.update(tuner_compile_s=round(log.compile_s, 3),
                           tuner_timing_s=round(log.timing_s, 3))
        return rec

    def _provenance(self, impl, log) -> dict:
        """config (JSON {tuner: {field: value}}), config_source, code_hash of this case."""
        from harness.tuning.provenance import autotune_picks, code_hash

        configs, source = log.configs(), log.source()
        try:
            if impl.name not in self.code_hashes:
                self.code_hashes[impl.name] = code_hash(impl.fn)
            if not configs and impl.backend == "triton":
                configs = autotune_picks(impl.fn)
                source = "autotune" if configs else None
        except Exception:  # provenance never fails a case: what is missing stays empty
            traceback.print_exc()
            self.code_hashes.setdefault(impl.name, None)
        return {"config": json.dumps(configs, sort_keys=False) if configs else None,
                "config_source": source, "code_hash": self.code_hashes[impl.name]}

    def _context_dead(self, exc: Exception) -> bool:
        if self.device != "cuda":
            return False
        import torch

        if isinstance(exc, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
            return False
        try:
            torch.cuda.synchronize()
            torch.zeros(1, device="cuda").add_(1).item()
            return False
        except Exception:
            return True


def _gpu_index() -> int | None:
    """The GPU this worker was pinned to (HARNESS_GPU, PCI bus order), None if not pinned."""
    gpu = os.environ.get("HARNESS_GPU")
    return int(gpu) if gpu is not None and gpu.isdigit() else None


def _registered_impl(row) -> str:
    """The registered impl a case runs (cases of older runs have no base_impl column)."""
    base = getattr(row, "base_impl", None)
    return base if isinstance(base, str) and base else row.impl


def impl_backend(op, impl_name: str | None) -> str | None:
    """The registered backend of `impl_name`; None for an impl the registry no longer has (the
    case's own pass says so)."""
    try:
        return op.get_impl(impl_name).backend if impl_name else None
    except Exception:
        return None


def _forced_config(row) -> dict:
    raw = getattr(row, "forced_config", None)
    return json.loads(raw) if isinstance(raw, str) and raw else {}
