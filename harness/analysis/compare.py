"""Is the candidate run faster than the base run, case by case, and is the difference real?

Pairs cases of two runs by (op, impl, params, dtype). For each pair:

    ratio    = median(base samples) / median(candidate samples)     (> 1: the candidate is faster)
    CI       = 95 % percentile bootstrap of that ratio (both sides resampled independently)
    p        = two-sided Mann-Whitney U test on the raw samples (scipy)

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

scipy is imported inside the functions that need it: the GPU worker path never imports this.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness import store
from harness.errors import HarnessError
from harness.values import finite as _num

# unjudged: CPU timings (interpreter wall-clock) are never faster or slower
MARKS = ("faster", "slower", "same", "ambiguous", "missing", "unjudged")
MIN_SAMPLES = 5  # fewer samples on a side than this: never a verdict, always ambiguous
N_BOOT = 2000

# env fields that must agree for two runs' timings to be comparable
ENV_KEYS = {
    "device": "device kind",
    "gpu_name": "GPU",
    "driver": "driver",
    "sm_clock_max_mhz": "max SM clock (MHz)",
    "mem_clock_max_mhz": "max memory clock (MHz)",
    "app_sm_clock_mhz": "application SM clock (MHz)",
    # None: a run from before the key was recorded (its L2 flush zeroed a buffer)
    "timing_method": "timing method",
}

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
# floor: runs stored before the time pass used several processes) | cpu | missing
TIME_COLUMNS = ["key", "op", "impl", "params", "dtype", "base_case_id", "cand_case_id",
                "base_ms", "cand_ms", "ratio", "ci_low", "ci_high", "p_value", "mark", "text",
                "base_n", "cand_n", "base_correct", "cand_correct", "threshold", "evidence",
                "clock_explained", "mde", "method"]
METRIC_COLUMNS = ["key", "impl", "name", "base", "cand", "delta", "rel_delta"]
# SM clocks under load (results' sm_clock_timed_mhz) this far apart: named as evidence, and a
# change no larger than the clock's move can explain is not credited to the code
CLOCK_MOVED = 0.02


@dataclass(frozen=True)
class TimeDiff:
    ratio: float  # base median / candidate median; > 1 means the candidate is faster
    ci_low: float  # 95 % bootstrap CI of the ratio
    ci_high: float
    p_value: float  # Mann-Whitney U, two-sided
    mark: str  # faster | slower | same | ambiguous
    text: str  # "1.18x faster (significant, p<0.001)"

    def ci_text(self) -> str:
        """`CI 1.15–1.21` in the direction of the change (slow-down factors when slower)."""
        lo, hi = (1 / self.ci_high, 1 / self.ci_low) if self.ratio < 1 else (self.ci_low,
                                                                              self.ci_high)
        return f"CI {lo:.2f}–{hi:.2f}"

    def change_text(self) -> str:
        """`1.18x faster (significant, p<0.001, CI 1.15–1.21)` for a marked change, else text."""
        if self.mark not in ("faster", "slower"):
            return self.text
        factor = self.ratio if self.mark == "faster" else 1 / self.ratio
        return f"{factor:.2f}x {self.mark} (significant, {fmt_p(self.p_value)}, {self.ci_text()})"


def fmt_p(p: float) -> str:
    return "p<0.001" if p < 0.001 else f"p={p:.3f}" if p < 0.01 else f"p={p:.2f}"


def fmt_pct(x: float) -> str:
    """0.02 -> '2%', 0.031 -> '3.1%', 0.25 -> '25%'."""
    v = x * 100
    return f"{v:.0f}%" if v >= 10 else f"{v:.2g}%"


def bootstrap_ratio_ci(base: np.ndarray, cand: np.ndarray, *, n_boot: int = N_BOOT,
                       seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile CI of median(base*) / median(cand*) over `n_boot` independent resamples."""
    rng = np.random.default_rng(seed)
    ratios = np.empty(n_boot)
    chunk = max(1, 2_000_000 // max(len(base), len(cand)))  # bound memory: ~16 MB per draw
    for start in range(0, n_boot, chunk):
        k = min(chunk, n_boot - start)
        mb = np.median(base[rng.integers(0, len(base), size=(k, len(base)))], axis=1)
        mc = np.median(cand[rng.integers(0, len(cand), size=(k, len(cand)))], axis=1)
        ratios[start:start + k] = mb / mc
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(ratios, [tail, 100 - tail])
    return float(lo), float(hi)


def compare_samples(base_ms, cand_ms, *, noise: float = 0.02, alpha: float = 0.01,
                    seed: int = 0) -> TimeDiff:
    """Compare two sets of raw timing samples (ms). Deterministic for a given seed.

    ratio = median(base) / median(cand); [lo, hi] = its 95 % bootstrap CI; p = Mann-Whitney U.

        faster     p < alpha and lo > 1 + noise       (the whole CI is a speed-up beyond noise)
        slower     p < alpha and hi < 1/(1 + noise)   (the whole CI is a slow-down beyond noise)
        same       1/(1 + noise) <= lo, hi <= 1 + noise  (whatever p: any shift is within noise)
        ambiguous  everything else: not significant with a CI wider than the noise band, or
                   significant but the CI reaches into the noise band; also any side with
                   fewer than MIN_SAMPLES samples
    """
    from scipy.stats import mannwhitneyu

    b = np.asarray(base_ms, dtype=float)
    c = np.asarray(cand_ms, dtype=float)
    b, c = b[np.isfinite(b)], c[np.isfinite(c)]
    if not len(b) or not len(c):
        raise ValueError("compare_samples needs at least one finite sample on each side")
    ratio = float(np.median(b) / np.median(c))
    lo, hi = bootstrap_ratio_ci(b, c, seed=seed)
    p = float(mannwhitneyu(b, c, alternative="two-sided").pvalue)
    if math.isnan(p):  # scipy gives NaN when every sample on both sides is identical
        p = 1.0
    ci = f"95% CI {lo:.2f}x-{hi:.2f}x"
    band = fmt_pct(noise)
    down = 1 / (1 + noise)  # the band is symmetric in log space
    if min(len(b), len(c)) < MIN_SAMPLES:
        return TimeDiff(ratio, lo, hi, p, "ambiguous",
                        f"ambiguous (too few samples: {len(b)} vs {len(c)}; {ci})")
    if p < alpha and lo > 1 + noise:
        return TimeDiff(ratio, lo, hi, p, "faster", f"{ratio:.2f}x faster (significant, "
                                                    f"{fmt_p(p)})")
    if p < alpha and hi < down:
        return TimeDiff(ratio, lo, hi, p, "slower", f"{1 / ratio:.2f}x slower (significant, "
                                                    f"{fmt_p(p)})")
    if lo >= down and hi <= 1 + noise:
        return TimeDiff(ratio, lo, hi, p, "same", f"same (within {band}, {fmt_p(p)})")
    if p >= alpha:
        return TimeDiff(ratio, lo, hi, p, "ambiguous",
                        f"ambiguous (not significant, {fmt_p(p)}; {ci})")
    return TimeDiff(ratio, lo, hi, p, "ambiguous",
                    f"ambiguous ({fmt_p(p)} but the {ci} reaches within {band} of 1x)")


def clock_ratio(rb: dict, rc: dict) -> float | None:
    """Candidate / base SM clock while the samples ran; None where either run lacks it."""
    a, b = _num(rb.get("sm_clock_timed_mhz")), _num(rc.get("sm_clock_timed_mhz"))
    return b / a if a and b else None


def clock_moved(k: float | None) -> bool:
    return k is not None and abs(math.log(k)) >= math.log1p(CLOCK_MOVED)


def same_code(rb: dict, rc: dict) -> bool:
    """Both runs record the case's code hash, the same, and the same launch config (or none)."""
    ha, hb = rb.get("code_hash"), rc.get("code_hash")
    if not (isinstance(ha, str) and ha == hb):
        return False
    ca, cb = rb.get("config"), rc.get("config")
    return (ca if isinstance(ca, str) else None) == (cb if isinstance(cb, str) else None)


def clock_explained(d: TimeDiff, k: float | None, noise: float, unchanged: bool) -> bool:
    """Whether a marked change of unchanged code and config is no more than the SM clock's
    move can explain. A kernel's time scales at most inversely with the SM clock (a
    compute-bound one does, a memory-bound one less), so the change counts only if its CI,
    divided by the clock ratio, still clears the noise band. The clocks are not locked here
    (the harness never changes them), and between two runs of unchanged code on one H200 they
    moved by up to 8 % on power-hungry kernels. Where the code or config changed, the change
    may have moved the clock itself (a kernel that draws more power runs slower clocks): the
    mark stands and the clock is only named."""
    if not unchanged or not clock_moved(k):
        return False
    if d.mark == "faster" and k > 1:
        return d.ci_low / k <= 1 + noise
    if d.mark == "slower" and k < 1:
        return d.ci_high / k >= 1 / (1 + noise)
    return False


def env_problems(env_a: dict, env_b: dict) -> list[str]:
    """What makes two env fingerprints incomparable (empty when comparable)."""
    env_a, env_b = env_a or {}, env_b or {}
    if env_a.get("device") != env_b.get("device"):  # the rest differs as a consequence
        return [f"device kind differs: {env_a.get('device')!r} vs {env_b.get('device')!r}"]
    out = []
    for key, label in ENV_KEYS.items():
        a, b = env_a.get(key), env_b.get(key)
        if key == "timing_method" and env_a.get("device") == "cuda":
            # GPU runs from before the method was recorded zeroed a buffer to flush the L2
            a, b = a or "l2-zero-flush (unrecorded)", b or "l2-zero-flush (unrecorded)"
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            if math.isclose(float(a), float(b)):
                continue
        elif a == b:
            continue
        out.append(f"{label} differs: {a!r} vs {b!r}")
    return out


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


def case_key(impl: str, params: dict, dtype: str) -> str:
    """`triton M=8192 N=8192 fp16`: the human name of a pair."""
    from harness.experiment.spec import DTYPE_SHORT

    shape = " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                     for k, v in params.items())
    return " ".join(s for s in (impl, shape, DTYPE_SHORT.get(dtype, dtype)) if s)



def _is_correct(row: dict) -> bool:
    """status ok and not marked incorrect (correct may be missing when checks were off)."""
    c = row.get("correct")
    return row.get("status") == "ok" and (bool(pd.isna(c)) or bool(c))


def impl_backend(op: str, impl: str, base_impl=None) -> str | None:
    """The registered backend of an implementation (a config variant's: its base impl's), or
    None where this process does not register it (the noise floor then treats it as ours)."""
    from harness.registry import get_op

    name = base_impl if isinstance(base_impl, str) and base_impl else impl
    try:
        return get_op(op).get_impl(name).backend
    except Exception:  # an op or impl this checkout does not have
        return None


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
    from harness.analysis.since import autotune_note, evidence  # since builds on compare

    for row in time_rows:  # what explains the pair (list): config, compiled, metrics, code
        row["evidence"] = evidence(row["key"], base_rows[row["base_case_id"]],
                                   cand_rows[row["cand_case_id"]], metrics)
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
