"""One wide row per case: cases + results + the profiler facts a reader needs first.

For a case with several kernels, additive counters (duration, DRAM bytes, FLOPs) are summed and
the per-launch facts (occupancy, registers, stalls, limiter) are those of the dominant kernel —
the one with the longest ncu duration. The speed-of-light percentages are also given for the
case as a whole (`case_<name>`): their mean over the case's kernels weighted by ncu duration,
i.e. the share of peak the case used over its whole time (one kernel: its own value).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from harness import store
from harness.profilers.metrics import STALL_REASONS, short_kernel_name

ADDITIVE = ("duration_us", "dram_bytes_read", "dram_bytes_write", "flop_count",
            "flop_count_tensor")
DOMINANT = ("dram_throughput_pct", "sm_throughput_pct", "memory_throughput_pct",
            "achieved_occupancy_pct", "theoretical_occupancy_pct", "registers_per_thread",
            "shared_mem_per_block_bytes", "block_size", "grid_size", "waves_per_sm",
            "tensor_pipe_pct", "l1_hit_rate_pct", "l2_hit_rate_pct", "sm_clock_hz")
WEIGHTED = ("sm_throughput_pct", "memory_throughput_pct", "dram_throughput_pct",
            "tensor_pipe_pct")


def _weighted(block: np.ndarray, j: int | None, jd: int | None) -> float | None:
    """Column j of one case's kernels (rows of `block`) averaged over them, weighted by their
    ncu duration (column jd)."""
    if j is None or jd is None:
        return None
    v, d = block[:, j], block[:, jd]
    ok = ~np.isnan(v) & ~np.isnan(d)
    total = float(d[ok].sum())
    if not ok.any() or total <= 0:
        return None
    return float((v[ok] * d[ok]).sum()) / total


def _spans(keys: np.ndarray) -> dict:
    """key -> (first, end) row of each run of equal keys in a sorted array."""
    cut = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    return {keys[a]: (a, b) for a, b in zip(np.r_[0, cut], np.r_[cut, len(keys)])}


def ncu_case_view(metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per ncu-profiled case, indexed by case_id in the metrics' order. One pivot of
    every case's kernels, then plain arrays per case (a pivot per case, ~3 ms each, was most
    of a 280-case run's summary)."""
    m = metrics[(metrics.source == "ncu") & (metrics.case_id != "")] if len(metrics) else metrics
    if not len(m):
        return pd.DataFrame()
    wide = m.pivot_table(index=["case_id", "kernel"], columns="name", values="value",
                         aggfunc="first")  # sorted by case, then kernel
    values = wide.to_numpy(dtype=float)
    col = {name: j for j, name in enumerate(wide.columns)}
    kernels = wide.index.get_level_values(1)
    spans = _spans(np.asarray(wide.index.get_level_values(0)))
    limiters = (m[m.name == "occupancy_limiter"].drop_duplicates(["case_id", "kernel"])
                .set_index(["case_id", "kernel"]).unit.to_dict())
    rows = []
    for case_id in dict.fromkeys(m.case_id):
        if case_id not in spans:  # not one value recorded
            continue
        lo, hi = spans[case_id]
        block = values[lo:hi]
        # the case's own columns: those where one of its kernels has a value
        has = {n: j for n, j in col.items() if not np.isnan(block[:, j]).all()}
        row = {"case_id": case_id, "ncu_kernels": int(hi - lo)}
        for k in ADDITIVE:
            if k in has:
                row["ncu_" + k if k == "duration_us" else k] = float(np.nansum(block[:, has[k]]))
        jd = has.get("duration_us")
        d = int(np.nanargmax(block[:, jd])) if jd is not None else 0  # the dominant kernel
        row["dominant_kernel"] = dom = kernels[lo + d]
        if jd is not None and np.nansum(block[:, jd]) > 0:
            row["dominant_share"] = float(block[d, jd] / np.nansum(block[:, jd]))
        for k in DOMINANT:
            if k in has and not np.isnan(block[d, has[k]]):
                row[k] = float(block[d, has[k]])
        for k in WEIGHTED:
            v = _weighted(block, has.get(k), jd)
            if v is not None:
                row["case_" + k] = v
        if (case_id, dom) in limiters:
            row["occupancy_limiter"] = limiters[case_id, dom]
        stalls = {r: float(block[d, has[f"stall_{r}"]]) for r in STALL_REASONS
                  if f"stall_{r}" in has and not np.isnan(block[d, has[f"stall_{r}"]])}
        # 'selected' is the issuing state and 'not_selected' an eligible warp passed over:
        # neither is a stall worth acting on
        ranked = sorted(((v, r) for r, v in stalls.items()
                         if r not in ("selected", "not_selected")), reverse=True)
        if ranked:
            row["top_stall"], row["top_stall_value"] = ranked[0][1], ranked[0][0]
        if len(ranked) > 1:
            row["second_stall"], row["second_stall_value"] = ranked[1][1], ranked[1][0]
        if row.get("flop_count") and row.get("ncu_duration_us"):
            row["ncu_tflops"] = row["flop_count"] / row["ncu_duration_us"] / 1e6
        dram = (row.get("dram_bytes_read") or 0) + (row.get("dram_bytes_write") or 0)
        if dram and row.get("ncu_duration_us"):
            row["ncu_dram_gbps"] = dram / row["ncu_duration_us"] / 1e3
        if dram and row.get("flop_count") is not None:
            row["counted_intensity"] = row["flop_count"] / dram
        rows.append(row)
    return pd.DataFrame(rows).set_index("case_id")


def kernel_view(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per case: kernels launched (nsys, else torch.profiler) and their GPU time."""
    if not len(metrics):
        return pd.DataFrame()
    for source in ("nsys", "torch_profiler"):
        m = metrics[metrics.source == source]
        if len(m):
            break
    else:
        return pd.DataFrame()
    tot = m[m.kernel == ""].pivot_table(index="case_id", columns="name", values="value",
                                         aggfunc="first")
    names = (m[(m.kernel != "") & (m.name == "kernel_launches")]
             .groupby("case_id").kernel.apply(lambda s: [short_kernel_name(k) for k in s]))
    out = pd.DataFrame(index=tot.index)
    out["kernel_source"] = source
    for c in ("kernel_count", "gpu_time_us", "api_time_us", "range_wall_us"):
        if c in tot:
            out[c] = tot[c]
    out["kernel_names"] = names.reindex(out.index).apply(
        lambda v: json.dumps(v) if isinstance(v, list) else "[]")
    return out


def derived_view(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per case: the case-level derived metrics (source `derived`, e.g. excess_traffic)."""
    if not len(metrics):
        return pd.DataFrame()
    m = metrics[(metrics.source == "derived") & (metrics.kernel == "")]
    if not len(m):
        return pd.DataFrame()
    return m.pivot_table(index="case_id", columns="name", values="value", aggfunc="first")


def summary_frame(run_dir: str | Path, metrics: pd.DataFrame | None = None) -> pd.DataFrame:
    """Cases joined with results and per-case profiler facts (one row per case); `metrics`:
    the run's metrics table where the caller has loaded it already."""
    cases = store.load_cases(run_dir)
    res = store.load_results(run_dir)
    metrics = store.load_metrics(run_dir) if metrics is None else metrics
    df = cases.merge(res, on="case_id", how="left")
    ncu = ncu_case_view(metrics)
    if len(ncu):
        df = df.merge(ncu, left_on="case_id", right_index=True, how="left")
    derived = derived_view(metrics)
    if len(derived):
        df = df.merge(derived, left_on="case_id", right_index=True, how="left")
    kv = kernel_view(metrics)
    if len(kv):
        df = df.merge(kv, left_on="case_id", right_index=True, how="left")
    df["params"] = df["params"].apply(store.params_of)
    return df
