"""Is the candidate run faster than the base run, case by case, and is the difference real?

Pairs cases of two runs by (op, impl, params, dtype). For each pair:

    ratio    = median(base samples) / median(candidate samples)     (> 1: the candidate is faster)
    CI       = 95 % percentile bootstrap of that ratio (both sides resampled independently)
    p        = two-sided Mann-Whitney U test on the raw samples (analysis.stats)

and a mark (see `compare_samples` for the rule): faster | slower | same | ambiguous, plus
"missing" for a pair without samples on one side and "unjudged" for CPU timings. Which noise a
pair is judged by (analysis.judge): the paired rounds of `harness ab` when the two runs are one
ab pair; else its own between-process spread (analysis.spread: the time pass times each case
in several worker processes), so run-to-run drift is not a change; for runs stored before
that, the A/A floor of analysis.noise (learned from A/A runs in the store, else a default).
Profiler metrics of the pair (canonical names, dominant kernel, see analysis.summary) are listed
when they moved beyond a small threshold.

Two runs are comparable only on the same GPU, driver, clock limits and device kind
(`env_problems`); otherwise `compare_runs` refuses unless told `allow_incomparable`.

scipy.special is imported inside the functions that need it: the GPU worker path never imports it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness import store
from harness.analysis.diff import (  # noqa: F401  (compare's names, as before)
    MARKS, MIN_SAMPLES, N_BOOT, ENV_KEYS, CLOCK_MOVED, TimeDiff,
    fmt_p, fmt_pct, bootstrap_ratio_ci, compare_samples, clock_ratio, clock_moved,
    same_code, clock_explained, env_problems, case_key, impl_backend)
from harness.errors import HarnessError
from harness.values import finite as _num

# summary column -> (canonical name, label, format, moved when |delta| >= abs, |rel| >= rel)
COMPARED_METRICS = (
    ("ncu_duration_us", "duration_us", "ncu duration", "{:.1f} us", 0.0, 0.02),
    ("achieved_occupancy_pct", "achieved_occupancy_pct", "achieved occupancy", "{:.0f}%", 2.0,
     0.0),
    ("theoretical_occupancy_pct", "theoretical_occupancy_pct", "theoretical occupancy",
     "{:.0f}%", 2.0, 0.0),
    ("dram_throughput_pct", "dram_throughput_pct", "DRAM throughput", "{:.0f}%", 2.0, 0.0),
    ("sm_throughput_pct", "sm_throughput_pct", "SM throughput", "{:.0f}%", 2.0, 0.0),
    ("tensor_pipe_pct", "tensor_pipe_pct", "tensor pipe", "{:.0f}%", 2.0, 0.0),
    ("registers_per_thread", "registers_per_thread", "registers", "{:.0f}", 1.0, 0.0),
    ("shared_mem_per_block_bytes", "shared_mem_per_block_bytes", "shared mem/block",
     "{:.0f} B", 1.0, 0.0),
    ("l2_hit_rate_pct", "l2_hit_rate_pct", "L2 hit rate", "{:.0f}%", 2.0, 0.0),
    ("kernel_count", "kernel_count", "kernels", "{:.0f}", 1.0, 0.0),
    ("block_size", "block_size", "block size", "{:.0f}", 1.0, 0.0),
    ("grid_size", "grid_size", "grid size", "{:.0f}", 1.0, 0.0),
)
METRIC_LABEL = {name: (label, fmt) for _, name, label, fmt, _, _ in COMPARED_METRICS}
# threshold: the band a change had to clear; mde: the smallest change the pair would mark with
# 80 % power; method: paired (harness ab) | measured (between-process spread) | floor (A/A
# floor: runs stored before the time pass used several processes) | cpu | missing;
# clock_explained / shape_explained: a mark the SM clock's move / the shape's unchanged
# implementations explain, not credited (analysis.diff.clock_explained, analysis.controls)
TIME_COLUMNS = ["key", "op", "impl", "params", "dtype", "base_case_id", "cand_case_id",
                "base_ms", "cand_ms", "ratio", "ci_low", "ci_high", "p_value", "mark", "text",
                "base_n", "cand_n", "base_correct", "cand_correct", "threshold", "evidence",
                "clock_explained", "shape_explained", "mde", "method"]
METRIC_COLUMNS = ["key", "impl", "name", "base", "cand", "delta", "rel_delta"]
@dataclass
class Comparison:
    base_run: str
    cand_run: str
    problems: list[str]  # env differences; non-empty only when allow_incomparable was given
    time: pd.DataFrame  # TIME_COLUMNS, one row per pair
    metrics: pd.DataFrame  # METRIC_COLUMNS, only metrics that moved; top_stall rows as strings
    headline: str
    cpu: bool = False  # either run timed on the CPU (interpreter wall-clock)
    notes: list[str] = field(default_factory=list)
    # analysis.spread.Rule: which evidence judged the pairs (.text, .as_dict()); for two runs
    # stored before the time pass used several processes, analysis.noise.NoiseFloor as before
    floor: object = None

    def pair_lines(self) -> list[str]:
        """One sentence per pair: time verdict then what changed (config, compiled kernel,
        profiler metrics that moved, code)."""
        return ["; ".join([f"{r.key}: {r.text}", *r.evidence]) for r in self.time.itertuples()]


def describe_metric(name: str, base, cand) -> str:
    if name == "top_stall":
        return f"top stall {base or '-'} -> {cand or '-'}"
    label, fmt = METRIC_LABEL.get(name, (name, "{:g}"))
    return f"{label} {fmt.format(base)} -> {fmt.format(cand)}"


def _is_correct(row: dict) -> bool:
    """status ok and not marked incorrect (correct may be missing when checks were off)."""
    c = row.get("correct")
    return row.get("status") == "ok" and (bool(pd.isna(c)) or bool(c))


def _cases(run_dir: Path) -> pd.DataFrame:
    from harness.analysis.summary import summary_frame

    df = summary_frame(run_dir)
    df["params_key"] = df["params"].apply(lambda p: json.dumps(p, sort_keys=True))
    return df


def metric_deltas(key: str, impl: str, base: dict, cand: dict) -> list[dict]:
    rows = []
    for col, name, _, _, abs_min, rel_min in COMPARED_METRICS:
        a, b = _num(base.get(col)), _num(cand.get(col))
        if a is None or b is None:
            continue
        delta = b - a
        rel = delta / a if a else (math.inf if delta else 0.0)
        if delta and abs(delta) >= abs_min and abs(rel) >= rel_min:
            rows.append({"key": key, "impl": impl, "name": name, "base": a, "cand": b,
                         "delta": delta, "rel_delta": rel})
    sa, sb = base.get("top_stall"), cand.get("top_stall")
    if isinstance(sa, str) and isinstance(sb, str) and sa != sb:
        rows.append({"key": key, "impl": impl, "name": "top_stall", "base": sa, "cand": sb,
                     "delta": None, "rel_delta": None})
    return rows


def mixed_gpu_problems(run_dir: Path, m: dict) -> list[str]:
    """A run whose cases ran on different GPU models (a Ray cluster, hand-merged parts)."""
    from harness.store.results import gpu_models

    models = gpu_models(store.load_cases(run_dir))
    return [f"run {m['run_id']} mixes GPU models ({', '.join(models)})"] if len(models) > 1 \
        else []


def compare_runs(base_dir, cand_dir, *, allow_incomparable: bool = False,
                 noise: float | None = None, alpha: float = 0.01) -> Comparison:
    """Pair the cases of two stored runs and compare their samples and profiler metrics.

    Each pair is judged by the evidence analysis.judge finds for it; `noise` (a fraction)
    judges every pair by that fixed floor instead (`compare --noise-floor`)."""
    base_dir, cand_dir = Path(base_dir), Path(cand_dir)
    mb, mc = store.load_manifest(base_dir), store.load_manifest(cand_dir)
    problems = env_problems(mb.get("env") or {}, mc.get("env") or {})
    problems += mixed_gpu_problems(base_dir, mb) + mixed_gpu_problems(cand_dir, mc)
    if problems and not allow_incomparable:
        raise HarnessError(f"runs {mb['run_id']} and {mc['run_id']} are not comparable: "
                           f"{'; '.join(problems)} (--allow-incomparable to compare anyway)")
    base, cand = _cases(base_dir), _cases(cand_dir)
    on = ["op", "impl", "params_key", "dtype"]
    pairs = base.merge(cand, on=on, suffixes=("_b", "_c"), sort=False)
    if not len(pairs):
        raise HarnessError(f"runs {mb['run_id']} and {mc['run_id']} have no case in common "
                           f"(paired by op, impl, params and dtype)")
    cpu = mb.get("device") != "cuda" or mc.get("device") != "cuda"
    sb = _sample_map(base_dir)
    sc = _sample_map(cand_dir)
    time_rows, metric_rows = [], []
    base_rows = base.set_index("case_id").to_dict("index")
    cand_rows = cand.set_index("case_id").to_dict("index")
    records = pairs.to_dict("records")
    from harness.analysis.judge import Judge  # judge builds on this module: import here

    judge = Judge(base_dir, cand_dir, mb, mc, records, base_rows, cand_rows, noise=noise,
                  alpha=alpha, cpu=cpu)
    for r in records:
        params = json.loads(r["params_key"])
        key = case_key(r["impl"], params, r["dtype"])
        rb, rc = base_rows[r["case_id_b"]], cand_rows[r["case_id_c"]]
        xb, xc = sb.get(r["case_id_b"]), sc.get(r["case_id_c"])
        row = {"key": key, "op": r["op"], "impl": r["impl"], "params": r["params_key"],
               "dtype": r["dtype"], "base_case_id": r["case_id_b"],
               "cand_case_id": r["case_id_c"], "base_ms": _num(rb.get("median_ms")),
               "cand_ms": _num(rc.get("median_ms")), "base_n": 0 if xb is None else len(xb),
               "cand_n": 0 if xc is None else len(xc), "base_correct": _is_correct(rb),
               "cand_correct": _is_correct(rc)}
        if xb is None or xc is None or not len(xb) or not len(xc):
            side = "base" if xb is None or not len(xb) else "candidate"
            row.update(ratio=math.nan, ci_low=math.nan, ci_high=math.nan, p_value=math.nan,
                       mark="missing", text=f"missing (no samples in the {side} run)",
                       threshold=math.nan, clock_explained=False, mde=math.nan,
                       method="missing")
        else:
            row.update(judge.verdict(r, rb, rc, xb, xc, row))
        time_rows.append(row)
        metric_rows.extend(metric_deltas(key, r["impl"], rb, rc))
    metrics = pd.DataFrame(metric_rows, columns=METRIC_COLUMNS)
    from harness.analysis import controls
    from harness.analysis.evidence import autotune_note, evidence

    controls.review(time_rows, base_rows, cand_rows)  # marks the shape's controls explain

    moved: dict[str, list[dict]] = {}  # the metrics' records by pair, read once (a filter
    for r in metrics.to_dict("records"):  # and to_dict per pair: 0.7 s of 280 pairs' 1.8 s)
        moved.setdefault(r["key"], []).append(r)
    for row in time_rows:  # what explains the pair (list): config, compiled, metrics, code
        row["evidence"] = evidence(base_rows[row["base_case_id"]],
                                   cand_rows[row["cand_case_id"]], moved.get(row["key"], []))
    time = pd.DataFrame(time_rows, columns=TIME_COLUMNS)
    rule = judge.rule
    if rule.fallback and not (rule.measured or rule.paired or rule.unjudged):
        rule = rule.floor  # runs stored before per-case evidence: the A/A floor, as before
    notes = [noise_note(rule)]
    autotuned = autotune_note(time_rows, base_rows, cand_rows)
    if autotuned:
        notes.append(autotuned)
    if cpu:
        notes.append("CPU run(s): timings are interpreter/CPU wall-clock: CPU: not judged "
                     "(a ratio and its CI, never faster or slower)")
    unpaired = (len(base) - len(pairs), len(cand) - len(pairs))
    if any(unpaired):
        notes.append(f"unpaired cases: {unpaired[0]} only in the base run, {unpaired[1]} only "
                     f"in the candidate run")
    return Comparison(mb["run_id"], mc["run_id"], problems, time, metrics,
                      headline_of(time, problems, cpu), cpu, notes, rule)


def noise_note(rule) -> str:
    """The comparison's noise note (analysis.spread.Rule: which evidence judged its pairs)."""
    if getattr(rule, "paired", None) or (getattr(rule, "unjudged", 0)
                                         and not (rule.measured or rule.fallback)):
        return f"noise threshold: {rule.text}"
    return (f"noise threshold: {rule.text}; a pair's threshold is the larger of that and its "
            f"own spread (2x relative IQR/sqrt(n)); faster/slower need p < 0.01 and the whole "
            f"95% CI beyond it")


def _sample_map(run_dir: Path) -> dict[str, np.ndarray]:
    s = store.load_samples(run_dir)
    if not len(s):
        return {}
    return {cid: g.sort_values("i")["ms"].to_numpy(dtype=float)
            for cid, g in s.groupby("case_id", sort=False)}


def headline_of(time: pd.DataFrame, problems: list[str], cpu: bool = False) -> str:
    counts = time["mark"].value_counts()
    parts = [f"{int(counts.get(m, 0))} {m}" for m in MARKS if counts.get(m, 0)]
    s = f"{len(time)} pairs: {', '.join(parts)}"
    ok = time[time.mark.isin(["faster", "slower", "same", "ambiguous"]) & time.base_correct
              & time.cand_correct & (time.ratio > 0)]
    if len(ok):
        g = float(np.exp(np.log(ok.ratio.astype(float)).mean()))
        s += f"; geo-mean time ratio base/candidate {g:.2f}x over {len(ok)} correct pairs"
    faster = time[time.mark == "faster"]
    if len(faster):
        best = faster.loc[faster.ratio.idxmax()]
        s += f"; best {best.key}: {best.text}"
    slower = time[time.mark == "slower"]
    if len(slower):
        worst = slower.loc[slower.ratio.idxmin()]
        s += f"; worst {worst.key}: {worst.text}"
    if cpu:
        s = "CPU timings, " + s
    if problems:
        s = "INCOMPARABLE RUNS (" + "; ".join(problems) + ") - " + s
    return s


def regressions(c: Comparison, threshold: float) -> pd.DataFrame:
    """Pairs marked slower (the noise rule: p < alpha and the whole CI beyond the pair's noise
    threshold) whose slow-down, point estimate, exceeds `threshold` (0.05 = 5 %)."""
    t = c.time
    return t[(t.mark == "slower") & (1 / t.ratio - 1 > threshold)]
