"""Two runs' Tuner picks side by side: where they agree, and how their timings compare.

    python3 tools/device/picks_compare.py RUN_A RUN_B

For every (tuner, key) timed in both runs (tuner_picks*.json, `harness picks`'s source): whether
the winners are the same config, the winner's first-pass ms in B against A, the median ratio
over every candidate timed in both (B/A), and each run's seconds timing and waiting for the GPU
lock. Made to check compile-ahead's tuning ahead (timed while other workers compile) against
the check pass's own (timed with nothing else running) on one machine.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness import store  # noqa: E402


def main(a: str, b: str) -> int:
    pa, pb = store.load_tuner_picks(Path(a)), store.load_tuner_picks(Path(b))
    same = diff = 0
    win_ratio, all_ratio, cost = [], [], {"A": [0.0, 0.0], "B": [0.0, 0.0]}
    for tuner in sorted(set(pa) & set(pb)):
        for key in sorted(set(pa[tuner]) & set(pb[tuner])):
            ra, rb = pa[tuner][key], pb[tuner][key]
            ea, eb = ra.get("evidence") or {}, rb.get("evidence") or {}
            for side, ev in (("A", ea), ("B", eb)):
                cost[side][0] += ev.get("timing_s") or 0.0
                cost[side][1] += ev.get("wait_s") or 0.0
            ms_a = {json.dumps(c["config"], sort_keys=True): c.get("ms")
                    for c in ea.get("candidates", [])}
            ms_b = {json.dumps(c["config"], sort_keys=True): c.get("ms")
                    for c in eb.get("candidates", [])}
            both = [k for k in ms_a if ms_a[k] and ms_b.get(k)]
            all_ratio += [ms_b[k] / ms_a[k] for k in both]
            wa = json.dumps(ra["config"], sort_keys=True)
            if wa == json.dumps(rb["config"], sort_keys=True):
                same += 1
            else:
                diff += 1
                fa, fb = ms_a.get(wa), ms_b.get(json.dumps(rb["config"], sort_keys=True))
                print(f"{tuner} {key}: A {ra['config']} ({fa}) B {rb['config']} ({fb})")
            if ms_a.get(wa) and ms_b.get(wa):
                win_ratio.append(ms_b[wa] / ms_a[wa])
    print(f"keys in both: {same + diff}, same winner {same}, other winner {diff}")
    if all_ratio:
        q = statistics.quantiles(all_ratio, n=20)
        print(f"every candidate's first-pass ms, B/A: median {statistics.median(all_ratio):.4f}"
              f" (5-95 %: {q[0]:.4f}-{q[-1]:.4f}, n={len(all_ratio)})")
    if win_ratio:
        print(f"A's winner's first-pass ms, B/A: median {statistics.median(win_ratio):.4f}, "
              f"min {min(win_ratio):.4f}, max {max(win_ratio):.4f}")
    for side in ("A", "B"):
        print(f"{side}: timing {cost[side][0]:.1f} s, of which waiting for the GPU lock "
              f"{cost[side][1]:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
