"""Run-to-run noise measured per case: the spread of a case's time between worker processes.

On a GPU the time pass times every case in `timing.processes` (default 2) worker processes,
one after the other, and keeps each process's median (results' `process_medians_ms`). Two runs
of unchanged code differ by what differs between processes (clocks, placement in memory, the
allocator, the other tenants of the GPU), which one process's samples cannot see; so for a pair
of runs a, b of one case:

    x_a,i = log of process i's median in run a, i = 1..P_a              (likewise x_b,j)
    s²    = the pooled variance of the x's about their own run's mean,  ν = P_a + P_b - 2
    s0²   = its peers' typical s²: the df-weighted mean over the NEIGHBOURS cases of the same
            implementation nearest in duration (any implementation's while it has fewer than
            MIN_POOL other cases), each capped at CAP x their median;  ν0 = their df, at most
            PRIOR_DF
    s̃²    = max(s², (ν0 s0² + ν s²) / (ν0 + ν))
            with two processes a side s² alone has 2 degrees of freedom (two processes may
            agree by chance): the peers' spread sets the band of a case that looks quieter
            than them; one that is noisier than its peers is judged by its own spread
    band  = expm1(t_{1 - ALPHA/2, ν0 + ν} · s̃ · sqrt(1/P_a + 1/P_b))

The band replaces the old global floor in analysis.compare's rule: faster/slower needs
Mann-Whitney p < 0.01 and the whole bootstrap CI of the median ratio beyond ±max(band, the
pair's within-run MDE). ALPHA = 0.001 two-sided: under the model, one unchanged case in a
thousand is marked. A case without that evidence on both sides (a run stored before the time
pass used several processes, or one timed by `harness ab`) falls back to analysis.noise's
learned A/A floor (or its old default).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

ALPHA = 0.001
PRIOR_DF = 16
MIN_POOL = 5
NEIGHBOURS = 8
CAP = 10.0


def log_medians(raw) -> np.ndarray | None:
    """The log per-process medians of a results cell (JSON list), None with fewer than two."""
    if raw is None or (isinstance(raw, float) and math.isnan(raw)):
        return None
    try:
        vals = json.loads(raw) if isinstance(raw, str) else list(raw)
    except (TypeError, ValueError):
        return None
    x = np.asarray([float(v) for v in vals if isinstance(v, (int, float))], dtype=float)
    x = x[np.isfinite(x) & (x > 0)]
    return np.log(x) if x.size >= 2 else None


@dataclass(frozen=True)
class Evidence:
    """One case's per-process log medians in both runs."""
    xa: np.ndarray
    xb: np.ndarray

    @property
    def df(self) -> int:
        return len(self.xa) + len(self.xb) - 2

    @property
    def s2(self) -> float:
        ss = float(((self.xa - self.xa.mean()) ** 2).sum() + ((self.xb - self.xb.mean()) ** 2)
                   .sum())
        return ss / self.df

    @property
    def scale(self) -> float:
        return math.sqrt(1 / len(self.xa) + 1 / len(self.xb))


@dataclass(frozen=True)
class Prior:
    s2: float  # typical between-process variance of the group's cases (log scale)
    df: int  # its degrees of freedom (the cases' summed)
    cases: int


def prior(evidence: list[Evidence]) -> Prior | None:
    """The df-weighted mean s² of `evidence` (each capped at CAP x the median), or None."""
    if not evidence:
        return None
    s2 = np.asarray([e.s2 for e in evidence], dtype=float)
    df = np.asarray([e.df for e in evidence], dtype=float)
    med = float(np.median(s2))
    capped = np.minimum(s2, CAP * med) if med > 0 else s2
    return Prior(float((capped * df).sum() / df.sum()), int(df.sum()), len(evidence))


def priors(cases: list[tuple[object, str, float, Evidence]]) -> dict[object, Prior | None]:
    """Each case's prior from its peers: (key, implementation, log duration, evidence) ->
    {key: the prior of its NEIGHBOURS nearest in duration among the other cases of its
    implementation (of any implementation while it has fewer than MIN_POOL others)}."""
    everything = sorted(cases, key=lambda c: c[2])
    groups: dict[str, list] = {}
    for c in everything:
        groups.setdefault(c[1], []).append(c)
    out: dict[object, Prior | None] = {}
    for impl, own in groups.items():
        pool = own if len(own) > MIN_POOL else everything
        durs = [c[2] for c in pool]
        for c in own:
            out[c[0]] = prior([e for e in _nearest(pool, durs, c)])
    return out


def _nearest(pool: list, durs: list[float], case) -> list[Evidence]:
    """The evidence of the NEIGHBOURS cases of `pool` (sorted by duration) nearest `case` in
    duration, `case` itself left out."""
    import bisect

    i = bisect.bisect_left(durs, case[2])
    lo, hi, got = i - 1, i, []
    while len(got) < NEIGHBOURS and (lo >= 0 or hi < len(pool)):
        left = durs[lo] if lo >= 0 else None
        right = durs[hi] if hi < len(pool) else None
        if right is not None and (left is None or right - case[2] <= case[2] - left):
            pick, hi = pool[hi], hi + 1
        else:
            pick, lo = pool[lo], lo - 1
        if pick[0] != case[0]:
            got.append(pick[3])
    return got


def band(e: Evidence, p: Prior | None, alpha: float = ALPHA) -> tuple[float, float, int]:
    """(band as a fraction, moderated sd s̃, degrees of freedom) of one case."""
    from harness.analysis.stats import t_ppf

    nu = e.df
    nu0 = 0 if p is None else min(PRIOR_DF, p.df)
    s2 = max(e.s2, (nu0 * p.s2 + nu * e.s2) / (nu0 + nu)) if nu0 else e.s2
    df = nu0 + nu
    crit = t_ppf(1 - alpha / 2, df)
    return float(math.expm1(crit * math.sqrt(s2) * e.scale)), math.sqrt(s2), df


@dataclass
class Rule:
    """How the pairs of one comparison were judged, for the notes and the since block.

    `measured` pairs by their own between-process spread (this module), `paired` pairs by
    harness ab's interleaved rounds (analysis.paired), `fallback` pairs by the A/A floor
    (`floor`, analysis.noise.NoiseFloor), `unjudged` pairs not at all (CPU timings)."""
    measured: list[float] = field(default_factory=list)  # the bands
    processes: set = field(default_factory=set)  # (P_a, P_b) seen
    paired: list[float] = field(default_factory=list)  # ab: the MDEs
    min_effect: float | None = None  # ab: the smallest change it marks
    fallback: int = 0
    unjudged: int = 0
    floor: object = None  # analysis.noise.NoiseFloor for the fallback pairs

    def for_impl(self, impl, backend=None) -> float:  # the fallback floor (old callers)
        return self.floor.for_impl(impl, backend) if self.floor is not None else 0.0

    @property
    def value(self) -> float | None:
        return self.floor.value if self.floor is not None else None

    @property
    def text(self) -> str:
        parts = []
        if self.paired:
            parts.append(f"paired rounds of harness ab (95% CI of the head/base ratio beyond "
                         f"±{self.min_effect * 100:g}%; median MDE "
                         f"{float(np.median(self.paired)) * 100:.2g}%)")
        if self.measured:
            procs = " or ".join(sorted(f"{a}+{b}" for a, b in self.processes))
            parts.append(f"each case's own between-process spread ({procs} processes, "
                         f"{(1 - ALPHA) * 100:g}% level; median band "
                         f"{float(np.median(self.measured)) * 100:.2g}%)")
        if self.fallback and self.floor is not None:
            lead = "" if not parts else f"{self.fallback} pairs without it: "
            parts.append(lead + self.floor.text)
        if self.unjudged:
            parts.append("CPU: not judged")
        return "; ".join(parts) or "no timed pair"

    def as_dict(self) -> dict:
        out = {"text": self.text, "measured": len(self.measured), "paired": len(self.paired),
               "fallback": self.fallback, "unjudged": self.unjudged,
               "min_effect": self.min_effect}
        if self.floor is not None:  # the fallback floor's own record (old readers: value)
            out.update({k: v for k, v in self.floor.as_dict().items() if k != "text"})
            out["floor_text"] = self.floor.text
        return out
