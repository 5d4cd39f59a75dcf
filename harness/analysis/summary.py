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


def _weighted(wide: pd.DataFrame, name: str) -> float | None:
    """`name` averaged over the kernels, weighted by their ncu duration."""
    if name not in wide or "duration_us" not in wide:
        return None
    ok = wide[name].notna() & wide["duration_us"].notna()
    total = float(wide.loc[ok, "duration_us"].sum())
    if not ok.any() or total <= 0:
        return None
    return float((wide.loc[ok, name] * wide.loc[ok, "duration_us"]).sum()) / total


def ncu_case_view(metrics: pd.DataFrame) -> pd.DataFrame:
    m = metrics[(metrics.source == "ncu") & (metrics.case_id != "")] if len(metrics) else metrics
    if not len(m):
        return pd.DataFrame()
    rows = []
    for case_id, g in m.groupby("case_id", sort=False):
        wide = g.pivot_table(index="kernel", columns="name", values="value", aggfunc="first")
        row = {"case_id": case_id, "ncu_kernels": int(len(wide))}
        for k in ADDITIVE:
            if k in wide:
                row["ncu_" + k if k == "duration_us" else k] = float(wide[k].sum(min_count=1))
        dom = wide["duration_us"].idxmax() if "duration_us" in wide and wide[
            "duration_us"].notna().any() else wide.index[0]
        row["dominant_kernel"] = dom
        if "duration_us" in wide and wide["duration_us"].sum() > 0:
            row["dominant_share"] = float(wide.loc[dom, "duration_us"] / wide["duration_us"].sum())
        for k in DOMINANT:
            if k in wide and pd.notna(wide.loc[dom, k]):
                row[k] = float(wide.loc[dom, k])
        for k in WEIGHTED:
            v = _weighted(wide, k)
            if v is not None:
                row["case_" + k] = v
        lim = g[(g.kernel == dom) & (g.name == "occupancy_limiter")]
        if len(lim):
            row["occupancy_limiter"] = lim.unit.iloc[0]
        stalls = {r: float(wide.loc[dom, f"stall_{r}"]) for r in STALL_REASONS
                  if f"stall_{r}" in wide and pd.notna(wide.loc[dom, f"stall_{r}"])}
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


def summary_frame(run_dir: str | Path) -> pd.DataFrame:
    """Cases joined with results and per-case profiler facts (one row per case)."""
    cases = store.load_cases(run_dir)
    res = store.load_results(run_dir)
    metrics = store.load_metrics(run_dir)
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
