"""The one table of tool-specific metric names -> canonical names (DESIGN.md).

Everything downstream (roofline, verdicts, reports, dashboard) reads canonical names only.
Units are base units: ns -> converted to us for duration_us, bytes, %, registers, counts.
"""
from __future__ import annotations

STALL_REASONS = (
    "long_scoreboard", "short_scoreboard", "barrier", "membar", "mio_throttle", "lg_throttle",
    "tex_throttle", "math_pipe_throttle", "wait", "not_selected", "selected", "dispatch_stall",
    "drain", "sleeping", "branch_resolving", "no_instruction", "imc_miss", "misc", "gmma",
)

# canonical name -> (ncu raw metric, unit, scale applied to the base-unit value)
NCU_METRICS: dict[str, tuple[str, str, float]] = {
    "duration_us": ("gpu__time_duration.sum", "us", 1e-3),
    "sm_throughput_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", 1.0),
    "memory_throughput_pct": ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
                              "%", 1.0),
    "dram_throughput_pct": ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", 1.0),
    "dram_bytes_read": ("dram__bytes_read.sum", "byte", 1.0),
    "dram_bytes_write": ("dram__bytes_write.sum", "byte", 1.0),
    "achieved_occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active", "%", 1.0),
    "theoretical_occupancy_pct": ("sm__maximum_warps_per_active_cycle_pct", "%", 1.0),
    "registers_per_thread": ("launch__registers_per_thread", "register/thread", 1.0),
    "shared_mem_per_block_bytes": ("launch__shared_mem_per_block", "byte/block", 1.0),
    "block_size": ("launch__block_size", "threads", 1.0),
    "grid_size": ("launch__grid_size", "blocks", 1.0),
    "waves_per_sm": ("launch__waves_per_multiprocessor", "waves", 1.0),
    "l1_hit_rate_pct": ("l1tex__t_sector_hit_rate.pct", "%", 1.0),
    "l2_hit_rate_pct": ("lts__t_sector_hit_rate.pct", "%", 1.0),
    "tensor_pipe_pct": ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed", "%", 1.0),
    "sm_clock_hz": ("sm__cycles_elapsed.avg.per_second", "hz", 1.0),
    "dram_clock_hz": ("dram__cycles_elapsed.avg.per_second", "hz", 1.0),
    "issue_active_pct": ("smsp__issue_active.avg.pct_of_peak_sustained_active", "%", 1.0),
}
for _r in STALL_REASONS:
    NCU_METRICS[f"stall_{_r}"] = (
        f"smsp__average_warps_issue_stalled_{_r}_per_issue_active.ratio", "cycles/inst", 1.0)

# Other spellings of a canonical metric, tried in order when its NCU_METRICS name is absent. The
# SpeedOfLight section of ncu 2025 (raw page and .ncu-rep made with sections only, no --metrics)
# names DRAM throughput and the SM clock differently; the NCU_METRICS name wins when both are there.
NCU_ALIASES: dict[str, tuple[str, ...]] = {
    "dram_throughput_pct": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",),
    "sm_clock_hz": ("gpc__cycles_elapsed.avg.per_second",),
}


def raw_names(canonical: str) -> tuple[str, ...]:
    """Every raw name `canonical` is read from, preferred first."""
    return (NCU_METRICS[canonical][0], *NCU_ALIASES.get(canonical, ()))

OCCUPANCY_LIMITS = {
    "registers": "launch__occupancy_limit_registers",
    "shared_mem": "launch__occupancy_limit_shared_mem",
    "warps": "launch__occupancy_limit_warps",
    "blocks": "launch__occupancy_limit_blocks",
    "barriers": "launch__occupancy_limit_barriers",
}

# FLOP counters: (raw metric, FLOPs per count). Tensor-path counters already count FLOPs
# (2 per MAC; checked on an H200: 4096^3 fp16 GEMM -> 2*4096^3). FMA = 2 FLOPs, ADD/MUL = 1,
# the convention of ncu's own roofline sections (SpeedOfLight_Hierarchical*RooflineChart).
FLOP_COUNTERS: dict[str, tuple[str, float]] = {
    "flop_ffma": ("sm__sass_thread_inst_executed_op_ffma_pred_on.sum", 2.0),
    "flop_fadd": ("sm__sass_thread_inst_executed_op_fadd_pred_on.sum", 1.0),
    "flop_fmul": ("sm__sass_thread_inst_executed_op_fmul_pred_on.sum", 1.0),
    "flop_hfma": ("sm__sass_thread_inst_executed_op_hfma_pred_on.sum", 2.0),
    "flop_hadd": ("sm__sass_thread_inst_executed_op_hadd_pred_on.sum", 1.0),
    "flop_hmul": ("sm__sass_thread_inst_executed_op_hmul_pred_on.sum", 1.0),
    "flop_dfma": ("sm__sass_thread_inst_executed_op_dfma_pred_on.sum", 2.0),
    "flop_dadd": ("sm__sass_thread_inst_executed_op_dadd_pred_on.sum", 1.0),
    "flop_dmul": ("sm__sass_thread_inst_executed_op_dmul_pred_on.sum", 1.0),
    "flop_tensor_fp16": ("sm__ops_path_tensor_src_fp16.sum", 1.0),
    "flop_tensor_bf16": ("sm__ops_path_tensor_src_bf16_dst_fp32.sum", 1.0),
    "flop_tensor_tf32": ("sm__ops_path_tensor_src_tf32_dst_fp32.sum", 1.0),
}


def extra_ncu_metrics() -> list[str]:
    """Raw metrics to request with --metrics on top of the sections (roofline + canonical)."""
    names = {raw for raw, _, _ in NCU_METRICS.values()}
    names |= set(OCCUPANCY_LIMITS.values())
    names |= {raw for raw, _ in FLOP_COUNTERS.values()}
    return sorted(names)

# Details page (`--page details`): (section display name, metric label) -> raw metric name, so a
# details export maps onto the same canonical names. Stall rows ("Stall Long Scoreboard", body of
# Warp State Statistics) are mapped by `stall_label_to_raw`.
NCU_DETAILS_LABELS: dict[tuple[str, str], str] = {
    ("GPU Speed Of Light Throughput", "Duration"): "gpu__time_duration.sum",
    ("GPU Speed Of Light Throughput", "DRAM Throughput"):
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    ("GPU Speed Of Light Throughput", "Memory Throughput"):
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"):
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    ("GPU Speed Of Light Throughput", "SM Frequency"): "sm__cycles_elapsed.avg.per_second",
    ("GPU Speed Of Light Throughput", "DRAM Frequency"): "dram__cycles_elapsed.avg.per_second",
    ("Launch Statistics", "Registers Per Thread"): "launch__registers_per_thread",
    ("Launch Statistics", "Block Size"): "launch__block_size",
    ("Launch Statistics", "Grid Size"): "launch__grid_size",
    ("Launch Statistics", "Waves Per SM"): "launch__waves_per_multiprocessor",
    ("Occupancy", "Achieved Occupancy"): "sm__warps_active.avg.pct_of_peak_sustained_active",
    ("Occupancy", "Theoretical Occupancy"): "sm__maximum_warps_per_active_cycle_pct",
    ("Occupancy", "Block Limit Registers"): "launch__occupancy_limit_registers",
    ("Occupancy", "Block Limit Shared Mem"): "launch__occupancy_limit_shared_mem",
    ("Occupancy", "Block Limit Warps"): "launch__occupancy_limit_warps",
    ("Occupancy", "Block Limit SM"): "launch__occupancy_limit_blocks",
    ("Occupancy", "Block Limit Barriers"): "launch__occupancy_limit_barriers",
    ("Memory Workload Analysis", "L1/TEX Hit Rate"): "l1tex__t_sector_hit_rate.pct",
    ("Memory Workload Analysis", "L2 Hit Rate"): "lts__t_sector_hit_rate.pct",
}
# Launch Statistics splits shared memory per block; the canonical value is their sum.
NCU_DETAILS_SHARED_MEM = ("Driver Shared Memory Per Block", "Dynamic Shared Memory Per Block",
                          "Static Shared Memory Per Block")
DETAILS_COMMAND_LINE_SECTION = "Command line profiler metrics"  # --metrics: raw names


def stall_label_to_raw(label: str) -> str | None:
    """'Stall Long Scoreboard' -> smsp__average_warps_issue_stalled_long_scoreboard_per_..."""
    name = label.strip().lower()
    name = name[len("stall "):] if name.startswith("stall ") else name
    name = name.replace(" ", "_")
    if name not in STALL_REASONS:
        return None
    return NCU_METRICS[f"stall_{name}"][0]


def short_kernel_name(name: str) -> str:
    """`void at::native::(anon)::cunn_SoftMaxForward<8, ...>(...)` -> `cunn_SoftMaxForward`."""
    n = name.split("(")[0] if not name.startswith("(") else name
    depth, base = 0, []
    for ch in n:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            base.append(ch)
    s = "".join(base).strip()
    s = s.split(" ")[-1] if " " in s else s
    return s.split("::")[-1] or name[:40]


# PC-sampling stall reasons (SourceCounters) -> canonical reasons above. Two spellings: the
# .ncu-rep metric suffixes (smsp__pcsamp_warps_issue_stalled_<r>) and the short column names of
# the source-page CSV (stall_<r>); names not listed here are canonical already.
PCSAMP_REASONS: dict[str, str] = {
    # .ncu-rep (smsp__pcsamp_warps_issue_stalled_<r>)
    "no_instructions": "no_instruction",
    # source-page CSV (stall_<r>)
    "long_sb": "long_scoreboard", "short_sb": "short_scoreboard", "math": "math_pipe_throttle",
    "mio": "mio_throttle", "lg": "lg_throttle", "tex": "tex_throttle",
    "no_inst": "no_instruction", "dispatch": "dispatch_stall", "sleep": "sleeping",
    "imc": "imc_miss",
}


def pcsamp_reason(name: str) -> str:
    """`long_sb` / `no_instructions` / `barrier` -> the canonical stall reason."""
    return PCSAMP_REASONS.get(name, name)
