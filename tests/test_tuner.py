"""The Tuner: declared fields and values, forced configs (whole and partial), the pick log,
picks persisted across processes, and the parallel precompile."""
import threading
from typing import NamedTuple

import pytest

from harness import tuning
from kernels._tuner import MIN_REPS, Rule, Tuner, interpreted, launches, precompile

FIELDS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
CANDS = [(128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2)]


class CPUTuner(Tuner):
    """Times on the CPU (the interpreter normally never times): fake milliseconds per config."""

    def __init__(self, *a, ms=None, **kw):
        super().__init__(*a, **kw)
        self.ms = ms or {}
        self.timed = []

    def timing_enabled(self):
        return True

    def precompile_enabled(self):
        return False

    def measure(self, launch, cfg):
        launch(cfg)
        self.timed.append(cfg)
        return self.ms.get(cfg, 1.0)


def flash_like(cls=Tuner, **kw):
    return cls("t.flash", FIELDS, configs=CANDS, values={"BLOCK_M": (16, 32)},
               rules=[Rule(("BLOCK_M", "BLOCK_N"), lambda m, n: m % n == 0,
                           "BLOCK_M % BLOCK_N == 0")], **kw)


@pytest.fixture(autouse=True)
def _clean_picks():
    tuning.load_picks({})
    tuning.take_new_picks()
    yield
    tuning.load_picks({})
    tuning.take_new_picks()


def test_valid_values_are_the_candidates_plus_the_documented_extras():
    t = flash_like()
    assert t.valid_values("BLOCK_M") == (16, 32, 64, 128)
    assert t.valid_values("num_stages") == (2, 3)
    assert t.violated({"BLOCK_M": 32, "BLOCK_N": 64}) == "BLOCK_M % BLOCK_N == 0"
    assert t.violated({"BLOCK_M": 128}) is None  # a rule needs all its fields
    with pytest.raises(ValueError, match="not a field"):
        Tuner("bad", ("A",), values={"B": (1,)})


def test_interpreter_uses_the_first_candidate_untimed_and_logs_it():
    t = flash_like()
    with tuning.recording() as log:
        assert t.pick("k", CANDS, lambda c: pytest.fail("no launch")) == CANDS[0]
    assert log.configs() == {"t.flash": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8,
                                         "num_stages": 3}}
    assert log.source() == "interpreter"


def test_a_whole_forced_config_wins_and_is_not_cached_as_the_pick():
    t = flash_like()
    with tuning.forcing({"t.flash": dict(zip(FIELDS, (32, 16, 2, 5)))}), \
            tuning.recording() as log:
        assert t.pick("k", CANDS, lambda c: None) == (32, 16, 2, 5)
    assert log.source() == "forced"
    assert t.pick("k", CANDS, lambda c: None) == CANDS[0]  # outside the block: unforced
    with tuning.forcing({"t.flash": dict(zip(FIELDS, (32, 64, 4, 3)))}):
        with pytest.raises(ValueError, match="BLOCK_M % BLOCK_N == 0"):
            t.pick("k", CANDS, lambda c: None)


def test_a_partial_forced_config_times_only_the_matching_candidates():
    t = flash_like(CPUTuner, ms={(128, 64, 8, 3): 2.0, (128, 128, 8, 2): 1.0})
    with tuning.forcing({"t.flash": {"BLOCK_M": 128}}), tuning.recording() as log:
        assert t.pick("k", CANDS, lambda c: None) == (128, 128, 8, 2)
    assert sorted(t.timed) == [(128, 64, 8, 3), (128, 128, 8, 2)]
    assert log.source() == "forced"
    # no candidate has BLOCK_N=32: the first candidate that keeps the rules, with it replaced
    with tuning.forcing({"t.flash": {"BLOCK_N": 32, "num_stages": 4}}):
        assert t.pick("k", CANDS, lambda c: None) == (128, 32, 8, 4)
    with tuning.forcing({"t.flash": {"BLOCK_M": 16, "BLOCK_N": 128}}):
        with pytest.raises(ValueError, match="fits no candidate"):
            t.pick("k", CANDS, lambda c: None)


class Cfg(NamedTuple):
    block: int
    warps: int


def test_namedtuple_and_bare_value_candidates_keep_their_kind():
    t = Tuner("t.nt", ("BLOCK", "num_warps"), configs=[Cfg(64, 4)], values={"BLOCK": (128,)})
    with tuning.forcing({"t.nt": {"BLOCK": 128, "num_warps": 4}}):
        got = t.pick("k", [Cfg(64, 4)], lambda c: None)
    assert isinstance(got, Cfg) and got == Cfg(128, 4)
    w = Tuner("t.warps", ("num_warps",), values={"num_warps": (4, 8)})
    with tuning.forcing({"t.warps": {"num_warps": 8}}), tuning.recording() as log:
        assert w.pick("k", [4, 8], lambda c: None) == 8
    assert log.configs() == {"t.warps": {"num_warps": 8}}


def test_the_log_names_repeated_picks_of_one_tuner_and_the_strongest_source():
    t = flash_like()
    with tuning.recording() as log:
        t.pick("a", CANDS, lambda c: None)
        t.pick("b", CANDS[1:], lambda c: None)
        t.pick("a", CANDS, lambda c: None)  # the same key again: one entry
    assert list(log.configs()) == ["t.flash", "t.flash#2"]
    log.add("other", "k", {}, "forced")
    assert log.source() == "forced"


def test_picks_on_another_thread_see_the_forced_config_the_log_and_compile_only():
    """Autograd runs a CUDA backward on its own thread (pt_autograd_0): a Tuner picking there
    must honour the worker's forced config, land in its pick log and obey compile-ahead."""
    def on_thread(fn):
        out = []
        th = threading.Thread(target=lambda: out.append(fn()))
        th.start()
        th.join()
        return out[0]

    t = flash_like(CPUTuner, ms={(64, 64, 4, 3): 0.5})
    with tuning.forcing({"t.flash": dict(zip(FIELDS, (32, 16, 2, 5)))}), \
            tuning.recording() as log:
        assert on_thread(lambda: t.pick("k", CANDS, lambda c: None)) == (32, 16, 2, 5)
    assert log.configs() == {"t.flash": dict(zip(FIELDS, (32, 16, 2, 5)))}
    assert log.source() == "forced"
    with tuning.compile_only():
        assert on_thread(lambda: t.pick("k2", CANDS, lambda c: None)) == CANDS[0]
    assert t.timed == [] and tuning.take_new_picks() == {}


def test_timed_picks_are_remembered_and_a_later_process_reuses_them(tmp_path):
    from harness import store

    t = flash_like(CPUTuner, ms={(64, 64, 4, 3): 0.5})
    assert t.pick(("fwd", 1), CANDS, lambda c: None) == (64, 64, 4, 3)
    assert len(t.timed) == 3
    new = tuning.take_new_picks()
    rec = new["t.flash"][repr(("fwd", 1))]
    assert list(new) == ["t.flash"] and list(new["t.flash"]) == [repr(("fwd", 1))]
    assert rec["config"] == {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
    assert rec["source"] == "tuned"
    assert [c["ms"] for c in rec["evidence"]["candidates"]] == [1.0, 0.5, 1.0]
    store.save_tuner_picks(tmp_path, new, shard="gpu1")
    # a fresh Tuner (another worker process) with the stored picks loaded times nothing
    fresh = flash_like(CPUTuner)
    tuning.load_picks(store.load_tuner_picks(tmp_path))
    with tuning.recording() as log:
        assert fresh.pick(("fwd", 1), CANDS, lambda c: None) == (64, 64, 4, 3)
    assert fresh.timed == [] and log.source() == "tuned"
    assert tuning.take_new_picks() == {}
    # a stored pick that is no longer among the candidates (the code changed) is timed again
    other = flash_like(CPUTuner)
    assert other.pick(("fwd", 1), [CANDS[0], CANDS[2]], lambda c: None) == CANDS[0]  # a tie
    assert set(other.timed) == {CANDS[0], CANDS[2]}


class DriftingTuner(CPUTuner):
    """The GPU warming up: every timing is `decay` faster than the one before it."""

    def __init__(self, *a, decay=0.97, **kw):
        super().__init__(*a, **kw)
        self.decay, self.k = decay, 0

    def measure(self, launch, cfg):
        ms = super().measure(launch, cfg) * self.decay ** self.k
        self.k += 1
        return ms


def test_finalists_are_timed_again_interleaved_so_drift_does_not_pick():
    """The first config in the list is truly fastest by 3 %, but a clock ramp makes each timing
    3 % faster than the last: one pass in list order picks the last; the rounds do not."""
    ms = {CANDS[0]: 0.97, CANDS[1]: 1.0, CANDS[2]: 1.0}
    t = flash_like(DriftingTuner, ms=ms)
    assert t.pick("k", CANDS, lambda c: None) == CANDS[0]
    first_pass, finals = t.timed[:3], t.timed[3:]
    assert first_pass == CANDS and len(finals) == 9  # 3 finalists x 3 rounds
    assert [finals[i * 3] for i in range(3)] != [finals[0]] * 3  # rotating order


def test_far_slower_candidates_are_not_finalists_and_near_ties_keep_list_order():
    t = flash_like(CPUTuner, ms={CANDS[0]: 1.005, CANDS[1]: 1.0, CANDS[2]: 2.0})
    assert t.pick("k", CANDS, lambda c: None) == CANDS[0]  # within 1 %: the earlier one
    assert t.timed.count(CANDS[2]) == 1  # 2x slower: timed once
    assert t.timed.count(CANDS[0]) == t.timed.count(CANDS[1]) == 5  # 1 + 2 finalists x 4 rounds
    t = flash_like(CPUTuner, ms={CANDS[0]: 1.05, CANDS[1]: 1.0, CANDS[2]: 2.0})
    assert t.pick("k2", CANDS, lambda c: None) == CANDS[1]  # 5 % is a real difference


def test_pick_files_merge_across_shards(tmp_path):
    from harness import store

    store.save_tuner_picks(tmp_path, {"a": {"k1": {"config": {"X": 1}, "source": "tuned"}}})
    store.save_tuner_picks(tmp_path, {"a": {"k2": {"config": {"X": 2}, "source": "tuned"}}},
                           shard="gpu0")
    store.save_tuner_picks(tmp_path, {"a": {"k3": {"config": {"X": 3}, "source": "tuned"}}},
                           shard="gpu0")
    (tmp_path / "tuner_picks.gpu1.json").write_text("{torn")
    picks = store.load_tuner_picks(tmp_path)
    assert sorted(picks["a"]) == ["k1", "k2", "k3"]


def test_precompile_launches_the_first_here_the_rest_in_threads_and_skips_failures():
    main = threading.get_ident()
    where = {}

    def launch(cfg):
        where[cfg] = threading.get_ident()
        if cfg == "bad":
            raise RuntimeError("out of shared memory")

    ok = precompile(["a", "b", "bad", "c"], launch)
    assert ok == ["a", "b", "c"]
    assert where["a"] == main
    assert all(where[c] != main for c in ("b", "bad", "c"))
    assert precompile(["bad"], launch) == []


class FirstFails(CPUTuner):
    """CANDS[0] raises when timed (a config out of registers or shared memory)."""

    error = "too many registers"

    def measure(self, launch, cfg):
        if cfg == CANDS[0]:
            raise RuntimeError(self.error)
        return super().measure(launch, cfg)


def test_a_tuner_skips_configs_that_fail_to_compile():
    t = flash_like(FirstFails, ms={CANDS[1]: 3.0, CANDS[2]: 2.0})
    assert t.pick("k", CANDS, lambda c: None) == CANDS[2]


def test_two_finalists_take_both_slots_equally_often_under_drift():
    """Two finalists, 4 rounds (AB BA AB BA): a 3 % per-timing drift cannot hand the pick to
    the one timed later; the truly 2 % faster first candidate wins."""
    ms = {CANDS[0]: 0.98, CANDS[1]: 1.0, CANDS[2]: 3.0}
    t = flash_like(DriftingTuner, ms=ms)
    assert t.pick("k3", CANDS, lambda c: None) == CANDS[0]
    assert t.timed[3:] == [CANDS[1], CANDS[0], CANDS[0], CANDS[1]] * 2  # drift made B look first


def test_timed_narrows_what_is_timed_and_forcing_still_reaches_every_candidate():
    """`timed` chooses the candidates timed when nothing is forced (a second kernel form that
    measured as fast everywhere it runs); a partial force matches all candidates and times the
    matching ones; a predicate that accepts none times them all."""
    cands = [(128, 64, 8, 3, 0), (64, 64, 4, 3, 0), (128, 64, 8, 3, 1), (64, 64, 4, 3, 1)]
    fields = (*FIELDS, "TMA")
    ms = {cands[0]: 0.5, cands[1]: 0.6, cands[2]: 1.0, cands[3]: 0.9}
    t = CPUTuner("t.form", fields, configs=cands, ms=ms)
    second = lambda c: c[-1] == 1  # noqa: E731
    assert t.pick("k", cands, lambda c: None, timed=second) == cands[3]
    assert set(t.timed) == {cands[2], cands[3]}  # the faster first-form configs were not timed
    t.timed.clear()
    with tuning.forcing({"t.form": {"TMA": 0}}), tuning.recording() as log:
        assert t.pick("k", cands, lambda c: None, timed=second) == cands[0]
    assert set(t.timed) == {cands[0], cands[1]} and log.source() == "forced"
    t2 = CPUTuner("t.form2", fields, configs=cands, ms=ms)
    assert t2.pick("k", cands[:2], lambda c: None, timed=second) == cands[0]  # none accepted
    t3 = CPUTuner("t.form3", fields, configs=cands, ms=ms)
    assert t3.pick("k", cands[:3], lambda c: None, timed=second) == cands[2]  # one: untimed
    assert t3.timed == [] and t3.sources["k"] == ("interpreter" if interpreted() else "single")
    # untimed (the interpreter): the first candidate of all, as before
    assert Tuner("t.form4", fields, configs=cands).pick("k", cands, lambda c: None,
                                                        timed=second) == cands[0]


def test_a_timed_pick_is_stored_with_every_candidates_timing_and_every_failure():
    """The evidence a pick rests on travels with it (tuner_picks.json): each candidate's first
    pass, the finalists' scores, and the error of one that failed — a surprising pick can be
    checked against the timings it was made from."""
    class Failing(FirstFails):
        error = "out of resource: shared memory\nrequired: 232448"

    t = flash_like(Failing, ms={CANDS[1]: 1.0, CANDS[2]: 1.05})
    assert t.pick("k", CANDS, lambda c: None) == CANDS[1]
    rec = tuning.take_new_picks()["t.flash"]["'k'"]
    ev = rec["evidence"]["candidates"]
    assert [c["config"]["BLOCK_N"] for c in ev] == [64, 64, 128]  # candidate order
    assert ev[0]["error"] == "RuntimeError: out of resource: shared memory"
    assert "ms" not in ev[0]
    assert ev[1]["ms"] == 1.0 and ev[2]["ms"] == 1.05
    assert ev[1]["final_ms"] == pytest.approx(1.0) and ev[2]["final_ms"] == pytest.approx(1.05)
    assert rec["config"] == t.as_dict(CANDS[1])


def test_precompile_keeps_why_a_candidate_failed():
    def launch(cfg):
        if cfg == "bad":
            raise ValueError("x" * 500)

    failed = {}
    assert precompile(["a", "bad"], launch, failed=failed) == ["a"]
    assert failed["bad"].startswith("ValueError: xxx") and len(failed["bad"]) == 200


def test_picks_verb_prints_the_evidence_and_rejects_an_unknown_tuner(tmp_path, capsys):
    from harness import store
    from harness.cli import main
    from harness.present.picks import rows

    run = tmp_path / "r1"
    run.mkdir()
    (run / store.MANIFEST).write_text("{}")
    ev = {"candidates": [{"config": {"B": 1}, "ms": 0.030},
                         {"config": {"B": 2}, "ms": 0.016, "final_ms": 0.0165},
                         {"config": {"B": 3}, "error": "RuntimeError: boom"},
                         {"config": {"B": 4}, "ms": 0.017, "final_ms": 0.0170}],
          "compile_s": 1.5, "timing_s": 0.4}
    store.save_tuner_picks(run, {"gn": {"(1, 320)": {"config": {"B": 2}, "source": "tuned",
                                                     "evidence": ev}}})
    ordered = rows(ev, {"B": 2})
    assert [r["config"]["B"] for r in ordered] == [2, 4, 1, 3]
    assert ordered[0]["picked"] and ordered[1]["vs_pick"] == pytest.approx(0.017 / 0.0165)
    assert main(["picks", str(run)]) == 0
    out = capsys.readouterr().out
    assert "RuntimeError: boom" in out and "30.0" in out and "16.5" in out
    assert main(["picks", str(run), "--tuner", "nope"]) == 2
    assert "--tuner" in capsys.readouterr().err


def test_a_partly_forced_pick_made_untimed_is_not_kept_for_later_timed_calls():
    """The time pass's second process first calls every case with nothing timed (prewarm:
    compile_only); a partly forced config picked then (the first matching candidate) must not
    stand in for the timed pick its later calls make."""
    t = flash_like(CPUTuner, ms={(128, 128, 8, 2): 0.5})
    part = {"t.flash": {"BLOCK_M": 128}}
    with tuning.forcing(part), tuning.compile_only():
        assert t.pick("k", CANDS, lambda c: None) == (128, 64, 8, 3)  # first match, untimed
    assert t.timed == []
    with tuning.forcing(part):
        assert t.pick("k", CANDS, lambda c: None) == (128, 128, 8, 2)  # timed: the faster one
    assert t.timed


def test_a_pick_made_while_a_call_is_set_up_is_untimed_unlogged_and_not_kept():
    """An op's binder runs what the measured call needs (the forward of a measured backward)
    under tuning.setup(): its Tuners take the first candidate that launches, time nothing,
    log nothing (the case's config is its measured call's), and a measured call of the same
    key still times."""
    t = flash_like(CPUTuner, ms={(128, 128, 8, 2): 0.5})
    launched = []

    def launch(c):
        launched.append(c)
        if c == CANDS[0]:
            raise RuntimeError("out of shared memory")

    with tuning.setup(), tuning.recording() as log:
        assert t.pick("k", CANDS, launch) == CANDS[1]  # the first that launched
        assert t.pick("k", CANDS, launch) == CANDS[1]  # remembered for set-up: no relaunch
    assert t.timed == [] and launched == [CANDS[0], CANDS[1]]
    assert len(log) == 0 and log.source() is None
    assert tuning.take_new_picks() == {}  # nothing persisted for later processes
    with tuning.recording() as log:
        assert t.pick("k", CANDS, lambda c: None) == (128, 128, 8, 2)  # measured: timed
    assert t.timed and log.source() == "tuned"
    t.timed.clear()
    with tuning.setup():  # a timed pick of the key is used as it is
        assert t.pick("k", CANDS, lambda c: pytest.fail("no launch")) == (128, 128, 8, 2)
    assert t.timed == []
    fails = iter([MemoryError("CUDA out of memory"), RuntimeError("no"), RuntimeError("no")])
    with tuning.setup(), pytest.raises(MemoryError, match="out of memory") as err:
        t.pick("other", CANDS, lambda c: (_ for _ in ()).throw(next(fails)))
    assert "none of 3 launch configurations" in "".join(getattr(err.value, "__notes__", []))
    part = {"t.flash": {"BLOCK_M": 128}}  # partly forced: the first match, untimed, unlogged
    with tuning.forcing(part), tuning.setup(), tuning.recording() as log:
        assert t.pick("k2", CANDS, lambda c: None) == (128, 64, 8, 3)
    assert t.timed == [] and len(log) == 0
    with tuning.forcing(part):
        assert t.pick("k2", CANDS, lambda c: None) == (128, 128, 8, 2)  # measured: timed


def test_setup_in_compile_ahead_launches_one_candidate_and_records_nothing():
    t = flash_like(CPUTuner)
    launched = []
    with tuning.setup(), tuning.compile_only(), tuning.recording() as log:
        assert t.pick("k", CANDS, launched.append) == CANDS[0]
    assert launched == [CANDS[0]] and len(log) == 0 and t.timed == []


def test_an_ops_binder_runs_under_setup_and_its_measured_call_does_not():
    from harness.registry import Op, Param

    op = Op("setup_probe", params=[Param("n", int)], dtypes=("float32",))
    seen = []

    @op.binder
    def bind(fn, inputs, p, out):
        seen.append(("bind", tuning.in_setup()))
        return lambda: seen.append(("call", tuning.in_setup()))

    op.bind(lambda: None, (), {"n": 1})()
    assert seen == [("bind", True), ("call", False)] and not tuning.in_setup()

    @op.binder
    def broken(fn, inputs, p, out):
        raise ValueError("bad inputs")

    with pytest.raises(ValueError):
        op.bind(lambda: None, (), {"n": 1})
    assert not tuning.in_setup()  # a binder that raised leaves no set-up behind


def test_a_timed_pick_keeps_how_long_it_waited_for_the_gpu(tmp_path, monkeypatch):
    """evidence wait_s: the seconds the Tuner's timing waited for the GPU lock while another
    process of the run held it (harness picks prints them)."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    from harness.tuning import gpu_lock

    lock = str(tmp_path / "locks" / "gpu0")
    monkeypatch.setenv(gpu_lock.ENV, lock)
    held = tmp_path / "held"
    code = ("import sys, time; from pathlib import Path; from harness.tuning import gpu_lock\n"
            "with gpu_lock.shared():\n    Path(sys.argv[1]).touch(); time.sleep(1.0)\n")
    root = Path(__file__).resolve().parent.parent
    p = subprocess.Popen([sys.executable, "-c", code, str(held)],
                         env={**os.environ, "PYTHONPATH": str(root)})
    deadline = time.monotonic() + 60
    while not held.exists():
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.02)
    t = flash_like(CPUTuner)
    t.pick("k", CANDS, lambda c: None)
    assert p.wait(timeout=60) == 0
    ev = t.evidence["k"]
    assert 0.5 < ev["wait_s"] <= ev["timing_s"]


def test_a_long_candidate_is_sized_by_one_launch_a_short_one_by_three():
    calls = []

    def estimate(ms_first, ms_next):
        def f(n):
            calls.append(n)
            return ms_first if len(calls) == 1 else ms_next
        return f

    assert launches(estimate(13.0, 1.0)) == MIN_REPS and calls == [1]  # 13 ms: 3 launches
    calls.clear()
    assert launches(estimate(4.0, 3.0)) == MIN_REPS and calls == [1]  # at REP_MS/3 or more
    calls.clear()
    assert launches(estimate(0.5, 0.2)) == 33 and calls == [1, 2]  # 10 ms / 0.3 ms mean
    calls.clear()
    assert launches(estimate(1e-3, 1e-3)) == 1000 and calls == [1, 2]  # at most MAX_REPS
