"""Dealing a run's profiler processes onto the GPUs of one host (--gpus), and when each GPU is
expected to be done. Pure: nothing here starts a process; every rule is unit-tested on the CPU.

    deal(units, cost, n, ...)        -> per GPU, {pass: case keys}: the passes' units dealt
                                        together (ncu on one GPU while nsys runs on another)
    planned_ends(per_gpu, units, ...) -> when the deal expects each GPU to be done
    lane_end(busy, procs, model)      -> when one GPU's processes end, in turn

A GPU's profiler processes start together when the deal is made and run in turn, in the order of
the passes (harness.execute.profiler_passes: ProfilerPasses._in_turn). The lane model, fitted to
four two-H100 runs of flash.yaml cold (a lane's modelled end within 1.8 s of its measured one
where the set-up was known; on later machines the plan was within 0.1-6.4 s of each GPU's end,
early where a GPU's ncu process held only light cases and its nsys process loaded faster):

- the first process is ready `ready_s` after its start: what of that is left when its GPU's
  measure passes end (`busy`) is waited for; its cases' first calls (`load`) are in its turn;
- a later process loads its cases while the earlier ones run, but only in the gaps between their
  profiled calls, which hold the GPU (gpu_lock): `hidden` of their time, measured 0.33-0.62 on
  ten lanes (about 1.1 behind an ncu process of light cases). What is left of its loads, and
  `first_s`, come after its turn;
- the lane's last process writes its report after its last case (`tail_s`); an earlier one does
  that while the next runs.

The old model (a process costs 4.5-6.5 s, loads counted whole) expected the two lanes to end
11 and 17 s after they did, and its deal left one GPU idle 6.4 s at the end (flash.yaml cold,
two H100s; `show`'s plan line)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

# a case's seconds under each profiler when no earlier run profiled it: from its first timing's
# median (ms), base + per_ms x median, fitted to six two-H100 runs of flash.yaml cold (ncu: 42
# cases, 0.6-5.3 s, mean error 0.57 s against 1.17 s for their mean; nsys: 1680 cases, 0.002
# against 0.019 s); without a timing, a flat prior (their mean)
PROFILE_CASE_FIT = {"ncu": (0.27, 0.59), "nsys": (0.002, 0.004)}
PROFILE_CASE_S = {"ncu": 2.1, "nsys": 0.02, "torch_profiler": 0.1, "default": 0.5}


def case_prior_s(p: str, median_ms: float | None) -> float | None:
    """A case's seconds under profiler `p` from its timed median (PROFILE_CASE_FIT); None
    where there is no fit or no median."""
    fit = PROFILE_CASE_FIT.get(p)
    if fit is None or not isinstance(median_ms, (int, float)) or not median_ms > 0:
        return None
    return fit[0] + fit[1] * float(median_ms)


@dataclass(frozen=True)
class ProcessModel:
    """What a profiler process costs a GPU beyond its cases (the module doc); seconds, per
    pass, "default" for any other. Measured on two H100s, flash.yaml cold: ncu was ready 7.5 s
    after its start, nsys 7.0 s; nsys reached its first case 1.5 s after its turn (its loads
    apart) and wrote its report in 1.7-2.2 s, ncu in 0.7-0.9 s."""
    ready_s: dict = field(default_factory=lambda: {"ncu": 7.5, "nsys": 7.0, "default": 7.0})
    first_s: dict = field(default_factory=lambda: {"ncu": 0.0, "nsys": 1.5, "default": 1.0})
    tail_s: dict = field(default_factory=lambda: {"ncu": 0.8, "nsys": 1.8, "default": 1.0})
    hidden: float = 0.5

    def of(self, table: dict, p: str) -> float:
        return table.get(p, table["default"])


MODEL = ProcessModel()


def lane_end(busy: float, procs: list[tuple[str, float, float]],
             model: ProcessModel = MODEL) -> float:
    """When a GPU's processes are done, in seconds from the deal: `busy` until the GPU is free
    for them, then `procs` in turn, each (pass, its cases' seconds, its loads' seconds)."""
    t = before = 0.0
    for k, (p, cases_s, load_s) in enumerate(procs):
        if k == 0:
            step = max(0.0, model.of(model.ready_s, p) - busy) + load_s + cases_s
        else:
            step = (model.of(model.first_s, p) + max(0.0, load_s - model.hidden * before)
                    + cases_s)
        t += step
        before += step
    return busy + t + (model.of(model.tail_s, procs[-1][0]) if procs else 0.0)


@dataclass
class _Piece:
    """A unit's cases (or part of them) under one pass: one process's worth on its GPU."""
    p: str
    ids: list
    cases_s: float
    load_s: float

    @property
    def weight(self) -> float:
        return self.cases_s + self.load_s


def _pieces(units: dict, cost: dict, load: dict, setup: dict, busy: list[float],
            n: int) -> list[_Piece]:
    """Every unit, one heavier than a GPU's fair share cut into as many pieces as it has fair
    shares (its cases dealt longest first onto the lightest piece; each piece pays the unit's
    `setup` again, its cases' loads once)."""
    def weight(u) -> float:
        return setup.get(u, 0.0) + sum(cost.get(c, 0.0) + load.get(c, 0.0) for c in units[u])
    fair = (sum(weight(u) for u in units) + sum(busy)) / n
    out = []
    for u, ids in units.items():
        k = min(n, len(ids), math.ceil(weight(u) / fair - 1e-9)) if n > 1 and fair > 0 else 1
        bins: list[list] = [[] for _ in range(max(1, k))]
        held = [0.0] * len(bins)
        for c in sorted(ids, key=lambda c: -(cost.get(c, 0.0) + load.get(c, 0.0))):
            j = min(range(len(bins)), key=held.__getitem__)
            bins[j].append(c)
            held[j] += cost.get(c, 0.0) + load.get(c, 0.0)
        out += [_piece(u, b, cost, load, setup) for b in bins if b]
    return out


def _piece(u: tuple, ids: list, cost: dict, load: dict, setup: dict) -> _Piece:
    """Unit `u`'s cases `ids` as one process's piece: their seconds, their loads and the
    unit's `setup`."""
    return _Piece(u[0], ids, sum(cost.get(c, 0.0) for c in ids),
                  setup.get(u, 0.0) + sum(load.get(c, 0.0) for c in ids))


def _lane(pieces: list[_Piece], order: list[str], busy: float, model: ProcessModel) -> float:
    procs = []
    for p in order:
        mine = [x for x in pieces if x.p == p]
        if mine:
            procs.append((p, sum(x.cases_s for x in mine), sum(x.load_s for x in mine)))
    return lane_end(busy, procs, model)


def deal(units: dict[tuple[str, str], list[str]], cost: dict[str, float], n: int,
         model: ProcessModel = MODEL, setup: dict | None = None, busy: list[float] | None = None,
         load: dict[str, float] | None = None,
         order: list[str] | None = None) -> list[dict[str, list[str]]]:
    """Several profiler passes dealt onto n GPUs together: per GPU, {pass: case keys} (each GPU
    runs one process per pass it got, in `order`, by default the passes' first appearance in
    `units`).

    `units[(pass, impl)]` are an implementation's cases under one pass, kept in one process
    (its compile and warm-up paid once); `cost[case]` their seconds under that profiler,
    `load[case]` what its first call costs a fresh process, `setup[unit]` a warm-up beyond
    those (an unknown load); `busy[i]`: seconds until GPU i is free for them (its measure
    passes still running). Largest piece first onto the GPU whose modelled end (lane_end) it
    raises least, then pieces are moved or swapped between GPUs while that shortens the last
    GPU's end (or, as long, evens the ends out)."""
    if n < 1:
        raise ValueError("n must be >= 1")
    setup, load = setup or {}, load or {}
    busy = list(busy) if busy else [0.0] * n
    order = order or list(dict.fromkeys(p for p, _ in units))
    lanes: list[list[_Piece]] = [[] for _ in range(n)]
    for x in sorted(_pieces(units, cost, load, setup, busy, n), key=lambda x: -x.weight):
        i = min(range(n), key=lambda i: (_lane(lanes[i] + [x], order, busy[i], model), i))
        lanes[i].append(x)
    _improve(lanes, order, busy, model)
    return [{p: [c for x in lane if x.p == p for c in x.ids] for p in order
             if any(x.p == p for x in lane)} for lane in lanes]


def _improve(lanes: list[list[_Piece]], order: list[str], busy: list[float],
             model: ProcessModel, rounds: int = 100) -> None:
    """Local search over the greedy deal: a piece moved to another GPU, or two pieces of two
    GPUs swapped, is kept when the ends' (max, sum of squares) falls; until none does."""
    ends = [_lane(lane, order, b, model) for lane, b in zip(lanes, busy)]

    def score(e: list[float]) -> tuple[float, float]:
        return (round(max(e), 6), round(sum(v * v for v in e), 6))
    for _ in range(rounds):
        best, move = score(ends), None
        for a in range(len(lanes)):
            for b in range(len(lanes)):
                if a == b:
                    continue
                for i, x in enumerate(lanes[a]):
                    for j in [None, *range(len(lanes[b]))]:
                        la = lanes[a][:i] + lanes[a][i + 1:] + ([] if j is None else [lanes[b][j]])
                        lb = ([y for k, y in enumerate(lanes[b]) if k != j]) + [x]
                        e = list(ends)
                        e[a] = _lane(la, order, busy[a], model)
                        e[b] = _lane(lb, order, busy[b], model)
                        if score(e) < best:
                            best, move = score(e), (a, b, la, lb, e)
        if move is None:
            return
        a, b, lanes[a], lanes[b], ends = move


def planned_ends(per_gpu: list[dict[str, list[str]]], units: dict[tuple[str, str], list[str]],
                 cost: dict[str, float], model: ProcessModel = MODEL,
                 setup: dict | None = None, busy: list[float] | None = None,
                 load: dict[str, float] | None = None,
                 order: list[str] | None = None) -> list[float]:
    """When the deal (`per_gpu`, the arguments it was made with) expects each GPU to be done,
    in seconds from the deal (lane_end): each unit a GPU holds cases of pays its `setup` there."""
    setup, load = setup or {}, load or {}
    order = order or list(dict.fromkeys(p for p, _ in units))
    unit_of = {c: u for u, ids in units.items() for c in ids}
    ends = []
    for i, got in enumerate(per_gpu):
        held: dict = {}  # unit -> its cases on this GPU, a piece
        for p, ids in got.items():
            for c in ids:
                held.setdefault(unit_of.get(c, (p, None)), []).append(c)
        pieces = [_piece(u, ids, cost, load, setup) for u, ids in held.items()]
        ends.append(_lane(pieces, order, busy[i] if busy else 0.0, model))
    return ends
