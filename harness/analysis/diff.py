"""Two sets of timing samples, and the facts around a pair of cases: the statistics every
comparison rests on (harness.analysis.compare pairs whole runs with them; judge, noise,
pairing and since use them too, without importing compare).

    ratio    = median(base samples) / median(candidate samples)     (> 1: the candidate is faster)
    CI       = 95 % percentile bootstrap of that ratio (both sides resampled independently)
    p        = two-sided Mann-Whitney U test on the raw samples (analysis.stats)

scipy.special is imported inside the functions that need it: the GPU worker path never imports it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

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


def change_text(ratio: float, digits: int = 2) -> str:
    """A time ratio (before / now) in words: 1.12 -> '1.12x faster', 0.8 -> '1.25x slower'."""
    return (f"{ratio:.{digits}f}x faster" if ratio >= 1 else
            f"{1 / ratio:.{digits}f}x slower")


def fmt_pct(x: float) -> str:
    """0.02 -> '2%', 0.031 -> '3.1%', 0.25 -> '25%'."""
    v = x * 100
    return f"{v:.0f}%" if v >= 10 else f"{v:.2g}%"


def _row_medians(x: np.ndarray) -> np.ndarray:
    """np.median(x, axis=1) of finite rows, by a sort: the same values, in a quarter of the
    time for the few samples a case has (a `compare` of 280 cases spent 0.4 s in medians)."""
    n = x.shape[1]
    s = np.sort(x, axis=1)
    return s[:, n // 2] if n % 2 else (s[:, n // 2 - 1] + s[:, n // 2]) / 2


def bootstrap_ratio_ci(base: np.ndarray, cand: np.ndarray, *, n_boot: int = N_BOOT,
                       seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile CI of median(base*) / median(cand*) over `n_boot` independent resamples."""
    rng = np.random.default_rng(seed)
    ratios = np.empty(n_boot)
    chunk = max(1, 2_000_000 // max(len(base), len(cand)))  # bound memory: ~16 MB per draw
    for start in range(0, n_boot, chunk):
        k = min(chunk, n_boot - start)
        mb = _row_medians(base[rng.integers(0, len(base), size=(k, len(base)))])
        mc = _row_medians(cand[rng.integers(0, len(cand), size=(k, len(cand)))])
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
    from harness.analysis.stats import mann_whitney_p

    b = np.asarray(base_ms, dtype=float)
    c = np.asarray(cand_ms, dtype=float)
    b, c = b[np.isfinite(b)], c[np.isfinite(c)]
    if not len(b) or not len(c):
        raise ValueError("compare_samples needs at least one finite sample on each side")
    ratio = float(np.median(b) / np.median(c))
    lo, hi = bootstrap_ratio_ci(b, c, seed=seed)
    p = mann_whitney_p(b, c)
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


def case_key(impl: str, params: dict, dtype: str) -> str:
    """`triton M=8192 N=8192 fp16`: the human name of a pair."""
    from harness.experiment.spec import DTYPE_SHORT

    shape = " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                     for k, v in params.items())
    return " ".join(s for s in (impl, shape, DTYPE_SHORT.get(dtype, dtype)) if s)



def impl_backend(op: str, impl: str, base_impl=None) -> str | None:
    """The registered backend of an implementation (a config variant's: its base impl's), or
    None where this process does not register it (the noise floor then treats it as ours);
    a run's own record of it: harness.op_card.backend."""
    from harness import op_card

    return op_card.backend(None, op, impl, base_impl)
