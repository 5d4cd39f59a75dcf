"""A mark its shape's unchanged implementations explain is not credited (analysis.controls).

Synthetic runs (tests/run_factory.py, labelled `synthetic`) whose time pass "ran" in two worker
processes that agree to 0.1 %, so each case's own band is narrow and a 3 % move between runs is
marked unless its controls (same shape, another implementation, unchanged code, like speed) moved
with it.
"""
from __future__ import annotations

import re

from run_factory import case_id, write_run

from harness.analysis import controls
from harness.analysis.compare import compare_runs
from harness.analysis.since import since_data

SHAPES = (1024, 2048, 4096, 8192)
MOVED = 4096


def medians(impls: dict[str, float], moved: dict[str, float] | None = None) -> dict[str, float]:
    """{"impl/N": ms}: an implementation's time is N/1000 x its factor; `moved` scales the
    implementations named at shape MOVED."""
    moved = moved or {}
    return {f"{i}/{n}": n / 1000 * f * (moved.get(i, 1.0) if n == MOVED else 1.0)
            for i, f in impls.items() for n in SHAPES}


def hashes(impls, changed: tuple[str, ...] = ()) -> dict[str, dict]:
    return {case_id(i, n): {"code_hash": f"{i}-{'new' if i in changed else 'old'}"}
            for i in impls for n in SHAPES}


def pair(tmp_path, impls: dict[str, float], moved: dict[str, float],
         changed: tuple[str, ...] = ()):
    a = write_run(tmp_path, minutes=0, medians=medians(impls), processes=2, proc_sd=0.001,
                  seed=1, n=100, extra=hashes(impls))
    b = write_run(tmp_path, minutes=5, medians=medians(impls, moved), processes=2,
                  proc_sd=0.001, seed=2, n=100, extra=hashes(impls, changed),
                  against={"how": "auto", "path": str(a), "run_id": a.name, "why": "test"})
    return a, b


def marks(t, impl: str) -> dict[int, str]:
    rows = t[t.impl == impl]
    return {int(k.split("N=")[1].split()[0]): m for k, m in zip(rows.key, rows.mark)}


def test_a_move_the_whole_shape_shares_is_not_credited(tmp_path):
    """Unchanged code, one shape 3 % slower for both implementations: each is the other's
    control, neither is marked, and the text and the since block say why."""
    a, b = pair(tmp_path, {"torch": 1.0, "triton": 1.0}, {"torch": 1.03, "triton": 1.03})
    t = compare_runs(a, b).time
    moved = t[t.key.str.contains(f"N={MOVED}")]
    assert set(moved.mark) == {"ambiguous"} and moved.shape_explained.all(), \
        moved[["key", "mark", "text"]]
    assert moved.ratio.lt(0.985).all()  # the move was there: 3 % slower
    text = moved[moved.impl == "triton"].text.iloc[0]
    assert re.match(r"not credited: 1\.03x slower .*, but this shape's unchanged implementations "
                    r"of like speed \(torch\) ran 1\.0[23]\dx slower, which explains it$", text), text
    assert not t[~t.key.str.contains(f"N={MOVED}")].shape_explained.any()
    s = since_data(b)
    assert any(n.startswith("not credited, the same shape's unchanged implementations moved "
                            "as much: 2 changes") for n in s.notes), s.notes


def test_a_change_of_one_implementation_stands_beside_still_controls(tmp_path):
    """triton's code changed and it is 3 % slower at one shape; torch did not move: marked."""
    a, b = pair(tmp_path, {"torch": 1.0, "triton": 1.0}, {"triton": 1.03}, changed=("triton",))
    t = compare_runs(a, b).time
    assert marks(t, "triton")[MOVED] == "slower" and not t.shape_explained.any()
    assert set(marks(t, "torch").values()) <= {"same", "ambiguous"}


def test_a_control_whose_code_changed_or_that_runs_far_slower_explains_nothing(tmp_path):
    """torch moved with triton but its own code changed; naive moved too but runs 10x slower
    (a different kernel's drift): triton's 3 % stays marked."""
    a, b = pair(tmp_path / "changed", {"torch": 1.0, "triton": 1.0},
                {"torch": 1.03, "triton": 1.03}, changed=("torch",))
    t = compare_runs(a, b).time
    assert marks(t, "triton")[MOVED] == "slower", t[["key", "mark", "text"]]
    a, b = pair(tmp_path / "slow", {"naive": 10.0, "triton": 1.0},
                {"naive": 1.03, "triton": 1.03})
    t = compare_runs(a, b).time
    assert marks(t, "triton")[MOVED] == "slower" and marks(t, "naive")[MOVED] == "slower"


def test_controls_moving_the_other_way_or_too_little_explain_nothing():
    """The rule's arithmetic: the CI divided by the controls' ratio must fall inside the band."""
    assert controls.explained("slower", 0.965, 0.975, 0.97, 0.01)
    assert not controls.explained("slower", 0.965, 0.975, 1.02, 0.01)   # controls got faster
    assert not controls.explained("slower", 0.90, 0.92, 0.98, 0.01)    # 8 % is not 2 %
    assert controls.explained("faster", 1.02, 1.03, 1.015, 0.01)
    assert not controls.explained("faster", 1.02, 1.03, 1.0, 0.01)
