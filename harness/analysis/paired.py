"""`harness ab`'s statistic: the paired ratio head/base of two code versions timed interleaved.

The ab worker (harness.execute.ab_worker) times both versions of a case in one process in rounds: a
round is a short burst of L2-flushed launches of one version and one of the other, the order
alternating from round to round (ABBA...), so drift, throttling and placement hit both alike.
A round gives one paired observation, the log of the ratio of its two burst medians:

    d_r   = log(head_r / base_r),                      r = 1..n rounds
    ratio = exp(trimmed mean of d)                     (Yuen: TRIM of each tail left out)
    CI    = exp(trimmed mean ± t_{0.975, h-1} · SE),   SE from the winsorized variance,
                                                      h = the rounds kept
    MDE   = expm1(log1p(MIN_EFFECT) + (t_{0.975} + t_{0.80}) · SE)
            the smallest true change this comparison marks with 80 % power

    slower     the whole CI above 1 + MIN_EFFECT        faster  the whole CI below 1/(1 + it)
    same       the CI inside [1/(1 + MIN_EFFECT), 1 + MIN_EFFECT]
    ambiguous  otherwise, or fewer than MIN_ROUNDS rounds

The band is the larger of MIN_EFFECT (0.5 %, `ab --min-effect`) and MIN_EFFECT_MS over the
base's time: two copies of the same kernel loaded twice in one process are not bit-for-bit the
same measurement (their launches come from other module objects and code), and on an H100 the
copies of ~10 us kernels stayed 1.3-1.9 % (0.15-0.19 us) apart with the same buffers and inputs,
while no case of 40 us or more was marked (softmax.yaml A/A, docs/measurement.md). A change far
below what a kernel engineer acts on is better called "same". Trimming keeps a round hit by a
hiccup (a clock step, another tenant) from widening or moving the interval.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

TRIM = 0.1
MIN_EFFECT = 0.005
MIN_EFFECT_MS = 0.0002  # 0.2 us: the per-launch part of two loaded copies' difference
MIN_ROUNDS = 5
POWER = 0.8


@dataclass(frozen=True)
class Paired:
    ratio: float  # head / base time: > 1 means the head is slower
    ci_low: float  # 95 % CI of that ratio (the text gives a speed-up's as base / head)
    ci_high: float
    p_value: float  # two-sided, H0: ratio 1
    se: float  # of the trimmed mean log ratio
    n: int  # rounds
    mde: float  # fraction: the smallest change marked with 80 % power
    band: float  # fraction: the change called "same" (MIN_EFFECT or MIN_EFFECT_MS / base)
    mark: str  # faster | slower | same | ambiguous
    text: str


def trimmed_mean_t(d, trim: float = TRIM, level: float = 0.95
                   ) -> tuple[float, float, int, float]:
    """(trimmed mean, its standard error, degrees of freedom, two-sided p for mean 0) of `d`
    (Yuen's trimmed mean with the winsorized variance)."""
    from harness.analysis.stats import t_sf

    x = np.sort(np.asarray(d, dtype=float))
    n = x.size
    g = int(math.floor(trim * n))
    h = n - 2 * g
    if h < 2:
        return float(np.mean(x)) if n else math.nan, math.inf, max(h - 1, 0), 1.0
    kept = x[g:n - g]
    w = np.clip(x, kept[0], kept[-1])
    var_w = float(np.var(w, ddof=1))
    se = math.sqrt((n - 1) * var_w / (h * (h - 1)))
    mean = float(kept.mean())
    df = h - 1
    if se == 0:
        return mean, 0.0, df, (1.0 if mean == 0 else 0.0)
    p = 2 * t_sf(abs(mean) / se, df)
    return mean, se, df, p


def paired(base_ms, head_ms, *, min_effect: float = MIN_EFFECT,
           min_effect_ms: float = MIN_EFFECT_MS, level: float = 0.95) -> Paired:
    """The paired statistic and mark of per-round burst medians (equal lengths)."""
    from harness.analysis.stats import t_ppf

    b = np.asarray(base_ms, dtype=float)
    h = np.asarray(head_ms, dtype=float)
    ok = np.isfinite(b) & np.isfinite(h) & (b > 0) & (h > 0)
    d = np.log(h[ok] / b[ok])
    n = int(d.size)
    mean, se, df, p = trimmed_mean_t(d)
    if n == 0 or not math.isfinite(mean):
        return Paired(math.nan, math.nan, math.nan, math.nan, math.inf, n, math.inf,
                      min_effect, "ambiguous", "ambiguous (no paired round)")
    min_effect = max(min_effect, min_effect_ms / float(np.median(b[ok])))
    crit = t_ppf(0.5 + level / 2, max(df, 1))
    lo, hi = math.exp(mean - crit * se), math.exp(mean + crit * se)
    ratio = math.exp(mean)
    power = t_ppf(POWER, max(df, 1))
    mde = math.expm1(math.log1p(min_effect) + (crit + power) * se)
    up, down = 1 + min_effect, 1 / (1 + min_effect)
    ci = f"CI {lo:.3f}–{hi:.3f}"
    band = f"{min_effect * 100:.2g}%"
    pt = "p<0.001" if p < 0.001 else f"p={p:.3f}" if p < 0.01 else f"p={p:.2f}"
    if n < MIN_ROUNDS:
        mark, text = "ambiguous", f"ambiguous (too few paired rounds: {n}; {ci})"
    elif lo > up:
        mark, text = "slower", f"{ratio:.3f}x slower (paired, {pt}, {ci})"
    elif hi < down:
        mark, text = "faster", (f"{1 / ratio:.3f}x faster (paired, {pt}, CI {1 / hi:.3f}–"
                                f"{1 / lo:.3f})")
    elif lo >= down and hi <= up:
        mark, text = "same", f"same (paired, within {band}, {ci})"
    else:
        mark, text = "ambiguous", f"ambiguous (paired, {pt}; {ci} reaches within {band} of 1x)"
    return Paired(ratio, lo, hi, p, se, n, mde, min_effect, mark, text)
