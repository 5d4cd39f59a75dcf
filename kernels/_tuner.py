"""The launch-config Tuner every Triton kernel here chooses its configuration with.

    _tuner = Tuner("attention.flash_fwd", fields=("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"),
                   configs=ALL_CONFIGS, values={"BLOCK_M": (16, 32, 64, 128)},
                   rules=[Rule(("BLOCK_M", "BLOCK_N"), lambda m, n: m % n == 0,
                               "BLOCK_M % BLOCK_N == 0")])
    config = _tuner.pick(key, candidates, launch)     # in warm-up, outside profiled ranges
    config = _tuner.pick(key, candidates, launch, timed=lambda c: c.tma == 1)  # see below

A candidate is a tuple (or NamedTuple) of the declared `fields`, or a bare value when there is
one field. Valid values of a field: those in `configs` (the static candidate lists) plus
`values` (documented extra ones). `rules` are invariants over several fields.

`pick` answers, in this order:
  1. a configuration forced by the harness (harness.tuning.forcing): all fields -> that config;
     some -> the best of the candidates matching them (timed as usual), or when none matches,
     the first candidate with those fields replaced that keeps the rules;
  2. the pick already made for this key in this process, or persisted by an earlier worker of
     the run (harness.tuning.stored_pick);
  3. the only candidate, or in the CPU interpreter the first one (untimed);
  3b. while a call is set up outside the measured region (harness.tuning.setup: the forward
     of a measured backward), the first candidate that launches (of those matching a partly
     forced config in 1.), untimed, kept for set-up calls only and not logged;
  4. in a compile-ahead worker (harness.tuning.compile_only): every candidate compiled, the
     first that launched returned, nothing timed or kept;
  5. on the GPU: the candidates compiled concurrently (`precompile`), the clocks brought up
     (`spin_up`), then timed one by one (`measure`: the median of L2-flushed launches, the
     host's launch time hidden as in the harness's timing); a config that fails to compile
     or run is skipped (its error is kept). The finalists (within FINALIST_BAND of the
     fastest, at most MAX_FINALISTS) are timed again over about FINAL_ROUNDS interleaved
     rounds in rotating order (a whole number of rotations, so each finalist takes every slot
     equally often), and the best geometric mean wins; a finalist within TIE of it that comes
     earlier in the candidate list wins instead. One pass in list order picked configs by
     when they were timed (an H200 warming up from idle, drift): two runs of unchanged code
     picked different triton_flash configs 4-8 % apart.
`timed` (optional) narrows what 4 and 5 compile and time when nothing is forced: only the
candidates it accepts (all of them if it accepts none). The others stay reachable by forcing
(a YAML `config: {TMA: 0}` is matched against every candidate and times the matching ones):
a kernel with a second form that measured as fast or faster wherever it runs times only that
form's tiles by default, and keeps the first form for the shapes the second cannot take and
for side-by-side runs.
Every pick is logged for the harness (harness.tuning.record) with its source, and a timed pick
is stored with its evidence (every candidate's first-pass and finalist milliseconds, or its
error), which `python -m harness picks RUN` prints: a surprising pick can be checked against
the timings it was made from.
"""
from __future__ import annotations

import math
import os
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

from harness import tuning
from harness.errors import exception_line
from harness.tuning import gpu_lock

PRECOMPILE_THREADS = 8
REP_MS = 10  # launches timed per measurement: about this many ms of them
MIN_REPS = 3
MAX_REPS = 1000
SPIN_UP_MS = 20  # launches before the first timing, so the clocks are up
FINALIST_BAND = 0.10  # re-timed: candidates within 10 % of the fastest of the first pass
MAX_FINALISTS = 3
FINAL_ROUNDS = 3
TIE = 0.01  # within 1 % of the best: the earlier candidate wins (the same pick run after run)


def interpreted() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def launches(estimate: Callable[[int], float]) -> int:
    """How many launches a measurement times: about REP_MS of them, MIN_REPS to MAX_REPS, by
    `estimate(calls)` (ms per launch over that many flushed launches): one launch, and where
    it took less than REP_MS / MIN_REPS two more (the three's mean)."""
    ms = estimate(1)
    if ms * MIN_REPS < REP_MS:  # else MIN_REPS launches, whatever two more would say
        ms = (ms + 2 * estimate(2)) / 3
    return max(MIN_REPS, min(MAX_REPS, int(REP_MS / ms)))


@dataclass(frozen=True)
class Rule:
    """An invariant over several fields: `test(*values)` must hold (`text` says what it is)."""

    fields: tuple[str, ...]
    test: Callable[..., bool]
    text: str


def precompile(candidates: Sequence, launch: Callable[[Any], None],
               initializer: Callable[[], None] | None = None,
               failed: dict | None = None) -> list:
    """Launch every candidate once so that they are compiled, the first on this thread (it
    sets up Triton's per-device caches), the rest concurrently from a thread pool (compilation
    releases the GIL). Returns the candidates that launched, in their order; `failed` (when
    given) gets {candidate: one-line error} for the others."""
    def attempt(cfg) -> bool:
        try:
            launch(cfg)
        except Exception as exc:  # a config that does not compile (smem, registers): skipped
            if failed is not None:
                failed[cfg] = exception_line(exc)
            return False
        return True

    if not candidates:
        return []
    first = [candidates[0]] if attempt(candidates[0]) else []
    rest = list(candidates[1:])
    if not rest:
        return first
    with ThreadPoolExecutor(min(PRECOMPILE_THREADS, len(rest)), initializer=initializer) as ex:
        results = list(ex.map(attempt, rest))
    return first + [c for c, good in zip(rest, results) if good]


class Tuner:
    """Pick the fastest launch configuration per key (see the module docstring)."""

    def __init__(self, name: str, fields: Sequence[str] | None = None, *,
                 configs: Iterable = (), values: Mapping[str, Iterable] | None = None,
                 rules: Iterable[Rule] = ()):
        self.name = name
        self.fields: tuple[str, ...] = tuple(fields or ())
        self.rules: tuple[Rule, ...] = tuple(rules)
        self._values: dict[str, set] = {f: set() for f in self.fields}
        for cfg in configs:
            for f, v in zip(self.fields, self._tuple(cfg)):
                self._values[f].add(v)
        for f, vals in (values or {}).items():
            if f not in self._values:
                raise ValueError(f"{name}: values given for {f!r}, not a field "
                                 f"(fields: {', '.join(self.fields)})")
            self._values[f].update(vals)
        for r in self.rules:
            unknown = [f for f in r.fields if f not in self._values]
            if unknown:
                raise ValueError(f"{name}: rule {r.text!r} names unknown field {unknown[0]!r}")
        self.best: dict[Hashable, Any] = {}
        self.sources: dict[Hashable, str] = {}
        self._dicts: dict[Any, dict] = {}
        self._forced_picks: dict[Hashable, Any] = {}
        self._setup_picks: dict[Hashable, Any] = {}  # untimed, for set-up calls only
        self._sized: dict[Any, tuple[int, int]] = {}  # this pick's cfg -> (launches, spin)
        self.evidence: dict[Hashable, dict] = {}  # key -> what its timed pick rests on

    # -- what the harness validates a YAML config against ------------------------------------
    def valid_values(self, field: str) -> tuple:
        return tuple(sorted(self._values[field], key=lambda v: (str(type(v)), v)))

    def violated(self, config: Mapping[str, Any]) -> str | None:
        """The text of the first rule `config` (some or all fields) breaks, else None."""
        for r in self.rules:
            if all(f in config for f in r.fields):
                try:
                    ok = bool(r.test(*(config[f] for f in r.fields)))
                except (TypeError, ValueError, ZeroDivisionError):
                    ok = False
                if not ok:
                    return r.text
        return None

    # -- candidates as field dicts -------------------------------------------------------------
    def _tuple(self, cfg) -> tuple:
        return tuple(cfg) if isinstance(cfg, tuple) else (cfg,)

    def as_dict(self, cfg) -> dict[str, Any]:
        vals = self._tuple(cfg)
        names = self.fields if len(self.fields) == len(vals) else [str(i) for i in
                                                                   range(len(vals))]
        return {n: _plain(v) for n, v in zip(names, vals)}

    def make(self, config: Mapping[str, Any], like):
        """A candidate of the same kind as `like` (tuple, NamedTuple or bare value)."""
        vals = [config[f] for f in self.fields]
        if not isinstance(like, tuple):
            return vals[0]
        if hasattr(like, "_make"):
            return type(like)._make(vals)
        return tuple(vals)

    # -- picking -----------------------------------------------------------------------------
    def pick(self, key: Hashable, candidates: Sequence, launch: Callable[[Any], None],
             timed: Callable[[Any], bool] | None = None):
        candidates = list(candidates)
        if not candidates:
            raise ValueError(f"{self.name}: no candidate configurations for {key!r}")
        fixed = tuning.forced(self.name) if self.fields else None
        if fixed:
            fkey = (key, tuple(sorted(fixed.items())))
            cfg = self._forced_picks.get(fkey)
            if cfg is None:
                cfg = self._forced(key, candidates, launch, fixed)
                if not (tuning.compiling_only() or tuning.in_setup()):  # untimed then
                    self._forced_picks[fkey] = cfg
            source = "forced"
        else:
            cfg, source = self._best(key, candidates, launch, timed)
        if source is None or tuning.in_setup():  # compile-ahead, set-up: nothing to record
            return cfg
        if tuning.recording_active():  # every call of a timed loop passes here: keep it cheap
            d = self._dicts.get(cfg)
            if d is None:
                d = self._dicts[cfg] = self.as_dict(cfg)
            tuning.record(self.name, key, dict(d), source)
        return cfg

    def _forced(self, key, candidates, launch, fixed: dict):
        unknown = [f for f in fixed if f not in self.fields]
        if unknown:
            raise ValueError(f"{self.name}: unknown field {unknown[0]!r} forced (fields: "
                             f"{', '.join(self.fields)})")
        if len(fixed) == len(self.fields):
            cfg = self.make(fixed, candidates[0])
            broken = self.violated(fixed)
            if broken:
                raise ValueError(f"{self.name}: forced config {_fmt(fixed)} breaks {broken}")
            return cfg
        matching = [c for c in candidates
                    if all(self.as_dict(c).get(f) == v for f, v in fixed.items())]
        if matching:
            return self._best((key, tuple(sorted(fixed.items()))), matching, launch)[0]
        for c in candidates:
            merged = {**self.as_dict(c), **fixed}
            if not self.violated(merged):
                return self.make(merged, c)
        merged = {**self.as_dict(candidates[0]), **fixed}
        raise ValueError(f"{self.name}: forced {_fmt(fixed)} fits no candidate "
                         f"({_fmt(merged)} breaks {self.violated(merged)})")

    def _best(self, key, candidates, launch, timed: Callable[[Any], bool] | None = None):
        """(config, source) for `key`; source None: compile-ahead's untimed answer, nothing
        to record."""
        if key in self.best:
            return self.best[key], self.sources.get(key)
        stored = tuning.stored_pick(self.name, key)
        if stored and self.fields and set(stored.get("config", {})) == set(self.fields):
            cfg = self.make(stored["config"], candidates[0])
            if cfg in candidates:  # the code's candidates may have changed since
                return self._keep(key, cfg, stored.get("source") or "tuned")
        # what is compiled and timed: the candidates `timed` accepts (all if none); untimed (the
        # interpreter), the first candidate of all
        pool = [c for c in candidates if timed(c)] if timed and self.timing_enabled() else []
        pool = pool or candidates
        if len(pool) == 1 or not self.timing_enabled():
            return self._keep(key, pool[0], "interpreter" if interpreted() else "single")
        if tuning.in_setup():  # outside the measured call: the first that launches, not kept
            cfg = self._setup_picks.get(key)
            if cfg is None:
                cfg = self._setup_picks[key] = self._first_launching(key, pool, launch)
            return cfg, None
        if tuning.compiling_only():  # compile-ahead: every candidate compiled, none timed or kept
            launched = precompile(pool, launch, initializer=_cuda_thread_initializer()) \
                if self.precompile_enabled() else []
            return (launched or pool)[0], None
        cfg = self._tune(key, pool, launch)
        tuning.remember(self.name, key, self.as_dict(cfg), "tuned", self.evidence.get(key))
        return self._keep(key, cfg, "tuned")

    def _keep(self, key, cfg, source: str) -> tuple[Any, str]:
        self.best[key] = cfg
        self.sources[key] = source
        return cfg, source

    def _first_launching(self, key, pool: list, launch: Callable[[Any], None]):
        """The first of `pool` that launches (set-up: nothing timed). When none does, the first
        candidate's own exception is raised (its type kept: an out-of-memory error is retried
        by the worker as such)."""
        first = None
        for cfg in pool:
            try:
                launch(cfg)
                return cfg
            except Exception as exc:  # out of smem or registers: the next one
                first = first or exc
        if hasattr(first, "add_note"):
            first.add_note(f"{self.name}: none of {len(pool)} launch configurations launched "
                           f"for {key}")
        raise first

    # -- timing (overridable: tests time on the CPU) -------------------------------------------
    def timing_enabled(self) -> bool:
        """Whether candidates are timed here (on a GPU: yes; in the interpreter: no)."""
        return not interpreted()

    def precompile_enabled(self) -> bool:
        return not interpreted()

    def measure(self, launch: Callable[[Any], None], cfg) -> float:
        """Milliseconds per launch of `cfg`: the median of single launches, each timed with
        CUDA events after an L2 flush, over about REP_MS (at least MIN_REPS launches), after
        three flushed launches that estimate the count and the host time (one where the
        first takes REP_MS / MIN_REPS or more: the count is MIN_REPS anyway; the two more were
        about 2 s of the Tuners' 25 s in flash_bwd.yaml's cold check on an H100, as counted
        from the picks' own timings).
        triton.testing.do_bench, used before, spent 6 launches on its estimate and at least
        one on warm-up before each timing, and timed a launch longer than REP_MS once: on an
        H200 the Tuners' timing was 26.5 of flash.yaml's 55 s cold check pass, and a 6 ms
        candidate was judged on one sample. A finalist timed again keeps the count and host
        time of its first pass (one warm-up launch instead of three estimating ones).
        The host's launch time is hidden
        (harness.execute.timing.spin_cycles) as in the harness's own timing: a form launching
        two kernels must not lose on Python time the case's timing does not count."""
        import torch

        from harness.execute.timing import flushed_call_ms, spin_cycles

        fn, flush, host = (lambda: launch(cfg)), _l2_flusher(), []
        sized = self._sized.get(cfg)
        if sized is None:
            n = launches(lambda calls: flushed_call_ms(fn, flush, calls, host))
            sized = self._sized[cfg] = (n, spin_cycles(host))
        else:  # a finalist timed again: sized by its first pass, one launch to warm it
            flushed_call_ms(fn, flush, 1)
        n, sleep = sized
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(n)]
        for a, b in events:
            flush()
            torch.cuda._sleep(sleep)
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        return statistics.median(a.elapsed_time(b) for a, b in events)

    def spin_up(self, launch: Callable[[Any], None], cfg) -> None:
        """Launch `cfg` (synchronously) for SPIN_UP_MS of wall time: an idle GPU's clocks are
        low, and the first candidates timed would look slower than they are. Nothing to do
        without a GPU."""
        import time

        import torch

        if not torch.cuda.is_available():
            return
        end = time.perf_counter() + SPIN_UP_MS / 1000
        while True:
            launch(cfg)
            _synchronize()
            if time.perf_counter() >= end:
                return

    def _tune(self, key, candidates, launch):
        import time

        todo = candidates
        failed: dict = {}  # candidate -> why it was skipped (kept with the pick)
        t0 = time.perf_counter()
        if self.precompile_enabled():
            todo = precompile(candidates, launch, initializer=_cuda_thread_initializer(),
                              failed=failed)
            _synchronize()
        t1, waited = time.perf_counter(), gpu_lock.waited_s()
        self._sized.clear()
        try:  # timed with the GPU to this process (another of the run may share it: gpu_lock)
            with gpu_lock.exclusive():
                cfg, first, final = self._time_all(key, todo, launch, failed)
        finally:  # what this pick cost the case: compile (and load) vs timing seconds
            cost = (t1 - t0, time.perf_counter() - t1)
            tuning.add_cost(*cost)
        self.evidence[key] = self._evidence(candidates, first, final, failed, cost)
        self.evidence[key]["wait_s"] = round(gpu_lock.waited_s() - waited, 3)
        return cfg

    def _evidence(self, candidates, first: dict, final: dict, failed: dict, cost) -> dict:
        """What a timed pick rests on, in candidate order: each candidate's first-pass ms, its
        finalist score (geometric mean of the rounds) or why it was skipped; stored with the
        pick (tuner_picks.json) and shown by `harness picks`."""
        rows = []
        for c in candidates:
            row: dict[str, Any] = {"config": self.as_dict(c)}
            if c in first:
                row["ms"] = first[c]
            if c in final:
                row["final_ms"] = final[c]
            if c in failed:
                row["error"] = failed[c]
            elif c not in first:
                row["error"] = "not timed"
            rows.append(row)
        return {"candidates": rows, "compile_s": round(cost[0], 3),
                "timing_s": round(cost[1], 3)}  # timing_s includes wait_s: the GPU lock's

    def _time_all(self, key, todo, launch, failed: dict):
        """(winner, {candidate: first-pass ms}, {finalist: score ms}); a candidate that fails
        to launch or time is skipped (its error kept in `failed`)."""
        timings = {}  # candidate index -> ms
        for i, cfg in enumerate(todo):
            try:
                if not timings:
                    self.spin_up(launch, cfg)
                timings[i] = self.measure(launch, cfg)
            except Exception as exc:  # fails to compile or launch (e.g. out of smem)
                failed[cfg] = exception_line(exc)
                continue
        if not timings:
            raise RuntimeError(f"{self.name}: no launch configuration compiled for {key}"
                               + (f" ({next(iter(failed.values()))})" if failed else ""))
        win, score = self._final(todo, timings, launch)
        return (todo[win], {todo[i]: ms for i, ms in timings.items()},
                {todo[i]: ms for i, ms in score.items()})

    def _final(self, todo: list, first: dict[int, float], launch) -> tuple[int, dict]:
        """(the index of the winner among the first pass's finalists, {finalist index: score
        ms}) (see the module doc)."""
        fastest = min(first.values())
        finalists = sorted((i for i, ms in first.items() if ms <= fastest * (1 + FINALIST_BAND)),
                           key=lambda i: first[i])[:MAX_FINALISTS]
        if len(finalists) == 1:
            return finalists[0], {}
        k = len(finalists)
        rounds: dict[int, list[float]] = {i: [] for i in finalists}
        for r in range(k * max(1, round(FINAL_ROUNDS / k))):  # whole rotations: 4 for 2, 3 for 3
            for i in finalists[r % k:] + finalists[:r % k]:
                rounds[i].append(self.measure(launch, todo[i]))
        # geometric mean: over whole rotations every finalist's timings sit at the same mean
        # position in time, so a drift linear in log time cancels (a median would keep part)
        score = {i: math.exp(sum(map(math.log, v)) / len(v)) for i, v in rounds.items()}
        best = min(score.values())
        return min(i for i in finalists if score[i] <= best * (1 + TIE)), score


_FLUSHER: list = []


def _l2_flusher():
    """This process's L2 flusher for timing (harness.execute.timing.Flusher, made on first use)."""
    if not _FLUSHER:
        from harness.execute.timing import Flusher

        _FLUSHER.append(Flusher("cuda", True))
    return _FLUSHER[0]


def _cuda_thread_initializer() -> Callable[[], None] | None:
    """Make pool threads use the calling thread's CUDA device."""
    import torch

    if not torch.cuda.is_available():
        return None
    dev = torch.cuda.current_device()
    return lambda: torch.cuda.set_device(dev)


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _plain(v):
    return v.item() if hasattr(v, "item") else v


def _fmt(config: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items())
