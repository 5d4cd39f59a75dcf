"""The worker of `harness ab`: `python -m harness worker --run HEAD_RUN --passes ab`.

The head run's manifest names the base run (`ab.base_path`); the two runs hold the same cases,
the base run's op is its commit's (harness.execute.code_tree), the head's the working tree's (or its
own commit's). Both live in this one process. For each case without an `ab` record:

  check  each version against its own op's reference, as the check pass does (Worker._one:
         fresh inputs, NaN-poisoned outputs), the base first;
  time   only when both are correct: the same inputs (one set, when both ops make equal ones
         from the same seed) and the same output buffer (when both make one of one layout:
         a memory-bound kernel's time depends on where its buffers lie, by a few % on an H100,
         which would read as a change), harness.execute.interleave.bench_pair; then,
         outside the samples, each version's peak memory and (GPU) compiled kernels;
  record check and time records into each run's parts (so every reader of a run sees an
         ordinary run), and the rounds into the head run's parts/ab.jsonl.

A case where either version fails (incorrect, raises, has no such implementation, cannot run
here) is recorded for both and timed for neither. Each version's Tuners pick within a scope of
their code (harness.tuning.scope): versions with the same code share one pick, versions with
different code each tune their own.
"""
from __future__ import annotations

import time
from pathlib import Path

from harness import store
from harness.execute.worker import EXIT_CONTEXT_DEAD, Worker, emit, timed_seed

ROLES = ("base", "head")


class AbWorker:
    def __init__(self, head_dir: Path, device: str):
        self.head = Worker(head_dir, device)
        ab = self.head.manifest.get("ab") or {}
        self.base = Worker(Path(ab["base_path"]), device)
        self.sides = {"base": self.base, "head": self.head}
        self.device = device
        self.flusher = None
        self.scopes: dict[tuple[str, str], str] = {}  # (role, impl) -> Tuner scope
        self.loaded: set[tuple[str, str]] = set()  # (scope, role) whose stored picks are in

    # -- scopes ------------------------------------------------------------------------------
    def _scope(self, role: str, impl) -> str:
        key = (role, impl.name)
        if key not in self.scopes:
            from harness.tuning.provenance import code_hash

            try:
                self.scopes[key] = f"code:{code_hash(impl.fn)}"
            except Exception:  # no hash: a scope of its own
                self.scopes[key] = f"{role}:{impl.name}"
        name = self.scopes[key]
        if (name, role) not in self.loaded:
            from harness import tuning

            with tuning.scope(name):
                tuning.merge_picks(store.load_tuner_picks(self.sides[role].run_dir))
            self.loaded.add((name, role))
        return name

    def _persist(self) -> None:
        from harness import tuning

        for name in set(self.scopes.values()):
            with tuning.scope(name):
                picks = tuning.take_new_picks()
            for (role, _), scope in self.scopes.items():
                if scope == name and picks:
                    store.save_tuner_picks(self.sides[role].run_dir, picks)

    # -- the loop ------------------------------------------------------------------------------
    def run(self, only: list[str] | None) -> int:
        done = {r["case_id"] for r in store.read_parts(self.head.run_dir, "ab")}
        todo = [c for c in self.head.cases if c[0] not in done and (only is None or c[0] in only)]
        if only is not None:
            rank = {c: i for i, c in enumerate(only)}
            todo.sort(key=lambda c: rank.get(c[0], 0))
        emit("pass", name="ab", total=len(todo))
        for case_id, impl_name, params, dtype in todo:
            emit("start", name="ab", case_id=case_id)
            began = time.perf_counter()
            recs, dead = self.one(case_id, impl_name, params, dtype)
            where = self.head.where()
            wall = round(time.perf_counter() - began, 3)
            for role, w in self.sides.items():
                for part in ("check", "time"):
                    store.append_part(w.run_dir, part, {"case_id": case_id, **recs[role][part],
                                                         **where, "wall_s": wall})
            self._persist()
            store.append_part(self.head.run_dir, "ab", {"case_id": case_id, **recs["ab"],
                                                        "wall_s": wall})
            emit("done", name="ab", case_id=case_id, status=recs["ab"]["status"])
            if dead:
                return EXIT_CONTEXT_DEAD
        return 0

    def one(self, case_id: str, impl_name: str, params, dtype: str) -> tuple[dict, bool]:
        """{base: {check, time}, head: {check, time}, ab: record} and whether the CUDA
        context died."""
        from harness import tuning

        checks = {}
        for role, w in self.sides.items():
            try:
                impl = w.op.get_impl(impl_name)
            except Exception as exc:  # the other version has no such implementation
                checks[role] = {"status": "error", "error": f"the {role} version: {exc}"}
                continue
            with tuning.scope(self._scope(role, impl)):
                checks[role] = w._one("check", case_id, impl_name, params, dtype, {})
        bad = [r for r in ROLES if checks[r].get("status") != "ok"]
        if bad:
            return self._not_timed(checks, bad), any(c.get("context_dead")
                                                     for c in checks.values())
        try:
            timed = self._time(case_id, impl_name, params, dtype, checks)
        except Exception as exc:  # a kernel that fails while timed fails its case
            import traceback

            from harness.errors import exception_line

            traceback.print_exc()
            err = {"status": "error", "error": exception_line(exc, 500)}
            return ({"base": {"check": checks["base"], "time": err},
                     "head": {"check": checks["head"], "time": err}, "ab": err},
                    self.head._context_dead(exc))
        return timed, False

    def _not_timed(self, checks: dict, bad: list[str]) -> dict:
        who = " and ".join(f"the {r} version" for r in bad)
        why = "; ".join(f"{r}: {checks[r].get('error') or checks[r].get('status')}"
                        for r in bad)
        out = {"ab": {"status": "not timed", "error": f"{who} failed ({why})"}}
        for role in ROLES:
            if role in bad:  # its own status (failed, error, skipped) comes from its check
                rec = {"status": "not timed", "error": checks[role].get("error")}
            else:
                rec = {"status": "skipped", "error": f"ab: not timed: {who} failed ({why})"}
            out[role] = {"check": checks[role], "time": rec}
        return out

    # -- timing --------------------------------------------------------------------------------
    def _inputs(self, case_id: str, params, dtype: str) -> dict:
        """Each version's inputs from the same seed; one set when they are equal (a tensor the
        head's op makes differently from the same seed twice, such as a torch.empty workspace,
        holds no content, so only its layout has to agree). One set matters: a memory-bound
        kernel's time moves by a few % with where its buffers lie."""
        import torch

        from harness.execute.correctness import TORCH_DTYPES

        def make(w):
            gen = torch.Generator(device=self.device)
            gen.manual_seed(timed_seed(case_id))
            return w.op.make_inputs(params, TORCH_DTYPES[dtype], self.device, gen)

        made = {role: make(w) for role, w in self.sides.items()}
        if _equal(made["base"], made["head"], again=make(self.head)):
            made["base"] = made["head"]
        return made

    def _time(self, case_id, impl_name, params, dtype, checks) -> dict:
        import torch

        from harness import tuning

        from harness.execute import timing

        from harness.execute import interleave

        inputs = self._inputs(case_id, params, dtype)
        fns, nbytes, impls, outs = {}, {}, {}, {}
        for role, w in self.sides.items():
            impls[role] = w.op.get_impl(impl_name)
            outs[role] = (w.op.make_out(inputs[role], params) if impls[role].accepts_out
                          else None)
        if outs["base"] is not None and _same_layout(outs["base"], outs["head"]):
            outs["base"] = outs["head"]  # one buffer: where it lies in memory favours neither
        for role, w in self.sides.items():
            impl, out = impls[role], outs[role]
            forced, scope = impl.split_config(w.forced.get(case_id) or {}), self._scope(role, impl)
            with tuning.scope(scope), tuning.forcing(forced):  # a binder's set-up: its version's
                fn = w.op.bind_impl(impl, inputs[role], params, out)
            fns[role] = _scoped(fn, scope, forced)
            nbytes[role] = sum(x.numel() * x.element_size() for x in (*inputs[role], out)
                               if isinstance(x, torch.Tensor))
        t = self.head.exp.timing
        if self.device == "cuda" and self.flusher is None:
            self.flusher = timing.Flusher("cuda", t.flush_l2)
        r = interleave.bench_pair(
            [fns["base"], fns["head"]], device=self.device, warmup_ms=t.warmup_ms,
            rep_ms=t.rep_ms, min_samples=t.min_samples, max_samples=t.max_samples,
            max_rel_err=t.max_rel_err, flush_l2=t.flush_l2, cuda_graph=t.cuda_graph,
            host_overhead=t.host_overhead, flusher=self.flusher,
            clock_probe=self.head._clock_probe() if self.device == "cuda" else None)
        out: dict = {}
        for v, role in enumerate(ROLES):
            s = r.samples[v]
            rec = {"status": "ok", "samples": list(s.ms), "process": 0, **s.summary(),
                   **{k: checks[role].get(k) for k in ("config", "config_source",
                                                       "code_hash")}}
            if self.device == "cuda":
                from harness.tuning.provenance import compiled_record

                rec["peak_mem_bytes"] = timing.peak_memory(fns[role], nbytes[role])
                with tuning.scope(self._scope(role, impls[role])):
                    rec.update(compiled_record(fns[role], impls[role].fn, self.head._sync))
            else:
                rec["peak_mem_bytes"], rec["compiled"] = None, []
            out[role] = {"check": checks[role], "time": rec}
        out["ab"] = {"status": "ok", "burst": r.burst, "rounds": [
            {"round": i, "first": ROLES[f], "base_ms": b[0], "head_ms": b[1], "clock_mhz": c}
            for i, (f, b, c) in enumerate(zip(r.first, r.burst_ms, r.clocks))]}
        return out


def _scoped(fn, scope: str, forced: dict):
    """`fn` called within its version's Tuner scope and forced launch config."""
    from harness import tuning

    def call():
        with tuning.scope(scope), tuning.forcing(forced):
            return fn()

    return call


def _same_layout(a, b) -> bool:
    """Whether output buffers `a` and `b` (a tensor or a tuple/list of them) are
    interchangeable: the same shapes, dtypes, strides and devices."""
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
                and a.device == b.device)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        return all(_same_layout(x, y) for x, y in zip(a, b))
    return False


def _equal(a: tuple, b: tuple, again: tuple | None = None) -> bool:
    """Whether input sets `a` and `b` are interchangeable: equal non-tensors, tensors of one
    layout with the same bits, except where `a`'s op made the tensor with other bits the second
    time (`again`, from the same seed): content nobody chose, such as a torch.empty workspace."""
    import torch

    if len(a) != len(b) or (again is not None and len(again) != len(a)):
        return False
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if not _same_layout(x, y):
                return False
            if not _same_bits(x, y):
                z = again[i] if again is not None else None
                if not (isinstance(z, torch.Tensor) and _same_layout(x, z)
                        and not _same_bits(x, z)):
                    return False
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or x != y:
            return False
    return True


def _same_bits(x, y) -> bool:
    import torch

    if x.numel() == 0:
        return True
    return torch.equal(x.detach().contiguous().reshape(-1).view(torch.uint8),
                       y.detach().contiguous().reshape(-1).view(torch.uint8))
