"""Validity flags and verdicts, written onto results.parquet after the profiler passes; the
excess-traffic factor of each ncu-profiled case goes into metrics.parquet (source `derived`).

Flags (strings, stored as a JSON list per case):
  kernels       the number of kernels in the case's NVTX range differs from what the impl
                declares, or ncu and nsys saw different counts (warm-up/autotune leaking in)
  nan-counters  ncu reported a kernel without a duration (counter collection failed)
  clocks        no SM clock recorded for the run / the profiled kernels
  events-vs-ncu events median and ncu duration differ by > 10 % for a case >= 50 us
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from harness import store
from harness.analysis import roofline, summary
from harness.analysis.verdict import assess
from harness.registry import Op, Params
from harness.store.results import ITEMSIZE
from harness.values import finite as _num

AGREE_TOL = 0.10
AGREE_MIN_US = 50.0



def flags_for(row: dict, expected: int | None, env: dict, profiled: dict[str, bool]) -> list[str]:
    out = []
    kc = _num(row.get("kernel_count"))
    ncu_k = _num(row.get("ncu_kernels"))
    src = row.get("kernel_source") or "nsys"
    if expected is not None and kc is not None and int(kc) != expected:
        out.append(f"kernels: {src} saw {int(kc)} in the range, the impl declares {expected}")
    if kc is not None and ncu_k is not None and int(kc) != int(ncu_k) and src == "nsys":
        out.append(f"kernels: ncu profiled {int(ncu_k)}, nsys saw {int(kc)}")
    if profiled.get("ncu") and ncu_k is not None and _num(row.get("ncu_duration_us")) is None:
        out.append("nan-counters: ncu gave no duration for this case")
    if profiled.get("ncu") and ncu_k is not None and _num(row.get("sm_clock_hz")) is None:
        out.append("clocks: ncu recorded no SM clock for this case")
    if env.get("device") == "cuda" and env.get("sm_clock_mhz") is None:
        out.append("clocks: nvidia-smi gave no SM clock for the run")
    med, dur = _num(row.get("median_ms")), _num(row.get("ncu_duration_us"))
    if med is not None and dur is not None and med * 1e3 >= AGREE_MIN_US:
        gap = abs(dur - med * 1e3) / (med * 1e3)
        if gap > AGREE_TOL:
            out.append(f"events-vs-ncu: events median {med * 1e3:.1f} us vs ncu "
                       f"{dur:.1f} us ({gap * 100:.0f}% apart)")
    return out


def annotate(run_dir: str | Path, op: Op) -> pd.DataFrame:
    manifest = store.load_manifest(run_dir)
    env = manifest.get("env") or {}
    cal = store.run_calibration(run_dir, Path("runs"))
    ceil = roofline.Ceilings.from_calibration(cal)
    view = summary.summary_frame(run_dir)
    passes = manifest.get("passes", {})
    profiled = {k: str(v).startswith("done") for k, v in passes.items()}
    res = store.load_results(run_dir)
    by_case = {r["case_id"]: r for r in view.to_dict("records")}
    flags, bounds, pcts, size_pcts, limiters, verdicts = [], [], [], [], [], []
    excess: dict[str, float] = {}
    from harness.store.results import gpu_models

    models = gpu_models(store.load_cases(run_dir))
    mixed = len(models) > 1  # no verdict from a run whose cases ran on different GPU models
    for case_id in res.case_id:
        row = by_case.get(case_id, {})
        params = Params(row.get("params") or {})
        # declared by the code that ran (stored by the check pass), never today's code
        expected = _num(row.get("expected_kernels"))
        expected = int(expected) if expected is not None else None
        f = flags_for(row, expected, env, profiled) if row.get("status") in ("ok", "failed") \
            else []
        if mixed:
            f.append(f"gpus: the run mixes GPU models ({', '.join(models)}); no verdict")
        flags.append(json.dumps(f))
        judged, place = None, None
        if row.get("dtype") in ITEMSIZE:
            judged, place = assess(row, op.flop_count(params),
                                   op.byte_count(params, ITEMSIZE[row["dtype"]]), ceil,
                                   env.get("device") == "cuda")
        # bound / pct_of_roof: the analytic placement (the report's "% of roof" says so);
        # limiter: what ncu's breakdown says limits the case (memory | compute | latency)
        bounds.append(place.bound if place else None)
        pcts.append(place.pct_of_roof * 100 if place else None)
        size_pcts.append(place.size_copy_pct * 100 if place and place.size_copy_pct else None)
        has_facts = place is not None or _num(row.get("ncu_duration_us")) is not None
        ok = judged is not None and has_facts and row.get("status") == "ok" and not mixed
        limiters.append(judged.bound if ok else None)
        verdicts.append(judged.text if ok else None)
        if judged is not None and judged.excess is not None:
            excess[case_id] = judged.excess
    res = res.assign(flags=flags, bound=bounds, pct_of_roof=pcts, pct_of_size_copy=size_pcts,
                     limiter=limiters, verdict=verdicts)
    store.write_table(run_dir, "results", res)
    write_excess_traffic(run_dir, excess)
    return res


def write_excess_traffic(run_dir: Path, excess: dict[str, float]) -> None:
    """metrics.parquet: one `excess_traffic` row (source derived, kernel "") per case, replacing
    those of an earlier annotate."""
    m = store.load_metrics(run_dir)
    stale = (m.source == "derived") & (m.name == "excess_traffic")
    if not excess and not stale.any():
        return  # nothing to add, nothing to drop: leave the file as it is
    rows = pd.DataFrame({"case_id": list(excess), "source": "derived", "kernel": "",
                         "name": "excess_traffic", "value": [float(v) for v in excess.values()],
                         "unit": "x"})
    frames = [f for f in (m[~stale], rows) if len(f)]
    store.write_table(run_dir, "metrics", pd.concat(frames, ignore_index=True) if frames
                      else rows)
