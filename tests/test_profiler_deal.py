"""The profiler processes' deal onto the GPUs of a host (harness.execute.executors.profiler_deal):
the lane model, the deal against every other deal of a real two-H100 run's figures, and the
ends `show` prints against the measured ones."""
from __future__ import annotations

import itertools

import pytest

from harness.execute.executors.profiler_deal import (MODEL, ProcessModel, deal, lane_end,
                                                     planned_ends)

# flash.yaml cold on two H100s (2026-11-28): per implementation, its cases' seconds under each
# profiler and what its cases' first calls cost a fresh process (parts/load)
NCU = {"naive": 5.33, "torch_compile": 3.75, "triton_flash": 2.84, "fused_mha": 1.52,
       "sdpa_flash": 1.51, "sdpa_efficient": 0.92, "sdpa_cudnn": 0.71}
NSYS = {"naive": 2.25, "torch_compile": 1.42, "fused_mha": 0.68, "sdpa_efficient": 0.55,
        "sdpa_flash": 0.28, "triton_flash": 0.21, "sdpa_cudnn": 0.17}
LOADS = {"torch_compile": 12.0, "sdpa_cudnn": 2.4, "triton_flash": 1.0, "fused_mha": 0.8,
         "naive": 0.2, "sdpa_efficient": 0.2, "sdpa_flash": 0.1}


def _flash(n_cases: int = 4):
    units, cost, load = {}, {}, {}
    for name, table in (("ncu", NCU), ("nsys", NSYS)):
        for impl, sec in table.items():
            k = 1 if name == "ncu" else n_cases
            cases = [f"{name}|{impl}.N={i}" for i in range(k)]
            units[(name, impl)] = cases
            cost.update(dict.fromkeys(cases, sec / k))
            if name == "nsys":  # ncu's first calls are in its cases' seconds
                load.update(dict.fromkeys(cases, LOADS[impl] / k))
    return units, cost, load


def test_lane_model_first_process_set_up_later_loads_hidden_and_the_last_tail():
    m = ProcessModel(ready_s={"a": 7.0, "b": 6.0, "default": 5.0},
                     first_s={"a": 0.0, "b": 1.5, "default": 1.0},
                     tail_s={"a": 0.8, "b": 2.0, "default": 1.0}, hidden=0.5)
    assert lane_end(3.0, [], m) == 3.0  # nothing to profile: free once its measure passes end
    # free at 2 s, ready at 7 s: 5 s of set-up waited for, its loads in its turn, its tail
    assert lane_end(2.0, [("a", 10.0, 1.0)], m) == pytest.approx(2 + 5 + 1 + 10 + 0.8)
    assert lane_end(9.0, [("a", 10.0, 1.0)], m) == pytest.approx(9 + 1 + 10 + 0.8)
    # the second loads beside the first: half the first's 16 s hides 8 of its 12 s of loads;
    # only the last process's tail counts (an earlier one writes while the next runs)
    assert lane_end(0.0, [("a", 10.0, 0.0), ("b", 3.0, 12.0)], m) == pytest.approx(
        7 + 10 + 1.5 + (12 - 0.5 * 17) + 3 + 2.0)
    assert lane_end(0.0, [("a", 10.0, 0.0), ("b", 3.0, 2.0)], m) == pytest.approx(
        7 + 10 + 1.5 + 0 + 3 + 2.0)
    assert MODEL.of(MODEL.ready_s, "torch_profiler") == MODEL.ready_s["default"]


def _best(units, cost, load, busy, n=2):
    """The lowest modelled makespan of any deal that keeps each unit in one process."""
    names = list(units)
    best = None
    for bits in itertools.product(range(n), repeat=len(names)):
        per = [dict() for _ in range(n)]
        for u, b in zip(names, bits):
            per[b].setdefault(u[0], []).extend(units[u])
        end = max(planned_ends(per, units, cost, busy=busy, load=load, order=["ncu", "nsys"]))
        best = end if best is None else min(best, end)
    return best


@pytest.mark.parametrize("busy", [[0.0, 0.0], [1.6, 9.2], [8.1, 15.7]])
def test_deal_of_a_real_run_is_near_the_best_and_beats_each_pass_split(busy):
    units, cost, load = _flash()
    per = deal(units, cost, 2, busy=busy, load=load, order=["ncu", "nsys"])
    for name, table in (("ncu", NCU), ("nsys", NSYS)):  # every case once, an impl together
        got = [c for g in per for c in g.get(name, [])]
        assert sorted(got) == sorted(c for (p, _), ids in units.items() if p == name
                                     for c in ids)
        for impl in table:
            assert sum(any(f"|{impl}." in c for c in g.get(name, [])) for g in per) == 1
    ends = planned_ends(per, units, cost, busy=busy, load=load, order=["ncu", "nsys"])
    best = _best(units, cost, load, busy)
    assert max(ends) <= best + 0.5, (ends, best)
    # against each pass split evenly over both GPUs (two processes a pass on each)
    halves = [dict(), dict()]
    for k, (u, ids) in enumerate(sorted(units.items(), key=lambda kv: -sum(
            cost[c] + load.get(c, 0.0) for c in kv[1]))):
        halves[k % 2].setdefault(u[0], []).extend(ids)
    assert max(ends) < max(planned_ends(halves, units, cost, busy=busy, load=load,
                                        order=["ncu", "nsys"]))


def test_deal_gives_a_gpu_still_measuring_less_and_cuts_a_heavy_unit():
    units, cost, load = _flash()

    def work(g):
        return sum(cost[c] + load.get(c, 0.0) for ids in g.values() for c in ids)
    free = deal(units, cost, 2, load=load)
    late = deal(units, cost, 2, busy=[0.0, 15.0], load=load)
    assert work(late[1]) < work(late[0]) and work(late[1]) < min(work(g) for g in free)
    # one unit heavier than a GPU's fair share: both GPUs take a piece of it
    heavy = {("nsys", "tc"): [f"nsys|tc.N={k}" for k in range(8)], ("ncu", "a"): ["ncu|a.N=0"]}
    hc = {**dict.fromkeys(heavy[("nsys", "tc")], 5.0), "ncu|a.N=0": 1.0}
    per = deal(heavy, hc, 2)
    assert all(g.get("nsys") for g in per)
    assert sorted(c for g in per for c in g["nsys"]) == sorted(heavy[("nsys", "tc")])
    assert deal(units, cost, 1, load=load)[0].keys() == {"ncu", "nsys"}
    with pytest.raises(ValueError):
        deal(units, cost, 0)


def test_planned_ends_count_each_held_units_setup_and_the_lane_model():
    units, cost, _ = _flash()
    setup = {("nsys", "torch_compile"): 9.0}
    per = deal(units, cost, 2, setup=setup)
    ends = planned_ends(per, units, cost, setup=setup)
    unit_of = {c: u for u, ids in units.items() for c in ids}
    for g, end in zip(per, ends):
        procs = [(p, sum(cost[c] for c in g[p]),
                  sum(setup.get(u, 0.0) for u in {unit_of[c] for c in g[p]}))
                 for p in ("ncu", "nsys") if g.get(p)]
        assert end == pytest.approx(lane_end(0.0, procs))


def test_local_search_mends_what_largest_first_leaves_uneven():
    # largest first: 3 | 3, then the 2s onto the lighter GPU: 3+2+2 = 7 against 3+2 = 5;
    # swapping a 3 for a 2 gives 6 and 6
    units = {("p", f"i{k}"): [f"p|i{k}"] for k in range(5)}
    cost = {f"p|i{k}": w for k, w in enumerate([3.0, 3.0, 2.0, 2.0, 2.0])}
    m = ProcessModel(ready_s={"default": 0.0}, first_s={"default": 0.0},
                     tail_s={"default": 0.0})
    per = deal(units, cost, 2, model=m)
    assert sorted(planned_ends(per, units, cost, model=m)) == [6.0, 6.0]


def test_a_timed_case_is_weighed_by_its_median():
    from harness.execute.executors.profiler_deal import PROFILE_CASE_FIT, case_prior_s

    a, b = PROFILE_CASE_FIT["ncu"]
    assert case_prior_s("ncu", 4.0) == pytest.approx(a + 4.0 * b)
    assert case_prior_s("nsys", 4.0) < case_prior_s("ncu", 4.0)
    for median in (None, 0.0, float("nan"), "x"):  # untimed: the flat prior instead
        assert case_prior_s("ncu", median) is None
    assert case_prior_s("torch_profiler", 4.0) is None  # no fit for it
