"""A change that its shape's unchanged implementations share is the machine's, not the code's.

Two runs of unchanged code differ case by case beyond what each run's own between-process spread
predicts (analysis.spread), and the excess is shared by the implementations of one shape that run
at a like speed: in one A/A pair of flash.yaml on an H100, sdpa_cudnn and triton_flash ran
1.9-3.0 % faster in the second run at five of the six causal D=128 shapes with N >= 4096 while
naive attention, several times slower, moved < 0.8 %; in another, triton_flash B=8 N=2048 D=64
bf16 ran 1.4 % slower beside sdpa_cudnn (0.7 %), sdpa_flash (1.2 %) and torch_compile at that
shape. So, as with the SM clock
(analysis.diff.clock_explained), a marked change is not credited where its controls explain it:

    controls   the other implementations of the same op, params and dtype whose code and config
               did not change between the runs (diff.same_code), timed in both, with a base
               median within DURATION_FACTOR of the case's
    k          exp(median of the controls' log time ratios)
    explained  a faster mark with k > 1 whose CI, divided by k, no longer clears the band (and
               a slower one with k < 1 alike)

A change of one implementation leaves its controls still, so it stands: in the before/after pairs
of runs/examples judged by per-process evidence, 22 of 23 marks (1.6-19 % changes of triton_flash,
its code changed) stood; the one that went was 1.054x with a 4.9 % band. Over 13 A/A pairs of
flash.yaml (3560 case pairs, H100 and H200) the rule took 14 of the 17 marks of unchanged code;
the 3 left, torch_compile at 1.13x, are Inductor choosing another kernel in another process.
Only pairs judged by their own between-process spread (`measured`) are reviewed, and only such
pairs serve as controls: an A/A floor (`floor`, analysis.noise) is learned from whole runs and so
carries their drift already, harness ab's rounds time both sides in one process, and CPU pairs
are never marked.
"""
from __future__ import annotations

import math

import numpy as np

from harness.analysis.diff import change_text, same_code
from harness.values import finite

DURATION_FACTOR = 2.0  # a control runs within 2x of the case's time (like kernels, like drift)
JUDGED = ("measured",)  # the method whose marks the rule reviews (and whose pairs serve)


def controls_ratio(row: dict, shape: list[dict], base_rows: dict, cand_rows: dict) -> tuple:
    """(k, controls' implementations) of one pair: `shape` are the time rows of its op,
    params and dtype."""
    picked = []
    for r in shape:
        if r is row or r["impl"] == row["impl"]:
            continue
        ratio, base_ms, own = r.get("ratio"), r.get("base_ms"), row.get("base_ms")
        if not (_pos(ratio) and _pos(base_ms) and _pos(own)):
            continue
        if not 1 / DURATION_FACTOR <= base_ms / own <= DURATION_FACTOR:
            continue
        if r.get("method") not in JUDGED or not (r["base_correct"] and r["cand_correct"]):
            continue
        if not same_code(base_rows[r["base_case_id"]], cand_rows[r["cand_case_id"]]):
            continue
        picked.append((math.log(ratio), r["impl"]))
    if not picked:
        return None, []
    return float(math.exp(np.median([x for x, _ in picked]))), [i for _, i in picked]


def review(rows: list[dict], base_rows: dict, cand_rows: dict) -> None:
    """Marks that the shape's controls explain become `ambiguous`, saying so (in place)."""
    shapes: dict[tuple, list[dict]] = {}
    for row in rows:
        row.setdefault("shape_explained", False)
        shapes.setdefault((row["op"], row["params"], row["dtype"]), []).append(row)
    for row in rows:  # a control's ratio, not its mark, counts: the order does not matter
        if row.get("mark") not in ("faster", "slower") or row.get("method") not in JUDGED:
            continue
        k, impls = controls_ratio(row, shapes[(row["op"], row["params"], row["dtype"])],
                                  base_rows, cand_rows)
        if k is None or not explained(row["mark"], row["ci_low"], row["ci_high"], k,
                                      row["threshold"]):
            continue
        moved = change_text(k, 3)
        row["mark"] = "ambiguous"
        row["shape_explained"] = True
        median = " (their median)" if len(impls) > 1 else ""
        row["text"] = (f"not credited: {row['text']}, but this shape's unchanged "
                       f"implementations of like speed ({', '.join(sorted(impls))}) ran "
                       f"{moved}{median}, which explains it")


def explained(mark: str, ci_low: float, ci_high: float, k: float, band: float) -> bool:
    if mark == "faster" and k > 1:
        return ci_low / k <= 1 + band
    if mark == "slower" and k < 1:
        return ci_high / k >= 1 / (1 + band)
    return False


def _pos(x) -> bool:
    v = finite(x)
    return v is not None and 0 < v < math.inf
