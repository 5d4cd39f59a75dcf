"""Student's t and the Mann-Whitney U test, as scipy.stats computes them, without importing
scipy.stats: on a 2-core machine its import took 1.3 s (scipy.special's 0.45 s), paid by every
`run`'s since block, every `show` and `compare`, and the dashboard's first page with a since
block. The results are scipy.stats' own (tests/test_stats.py compares them).
"""
from __future__ import annotations

import math

import numpy as np


def t_ppf(q: float, df: float) -> float:
    """scipy.stats.t.ppf(q, df)."""
    from scipy.special import stdtrit

    return float(stdtrit(df, q))


def t_sf(x: float, df: float) -> float:
    """scipy.stats.t.sf(x, df)."""
    from scipy.special import stdtr

    return float(stdtr(df, -x))


def _ranks(xy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(average ranks, 1-based, of `xy`; the sizes of its groups of tied values)."""
    order = np.argsort(xy, kind="mergesort")
    s = xy[order]
    edges = np.flatnonzero(np.r_[True, s[1:] != s[:-1], True])
    ties = np.diff(edges)
    mean_rank = (edges[:-1] + edges[1:] - 1) / 2 + 1
    ranks = np.empty(xy.size)
    ranks[order] = np.repeat(mean_rank, ties)
    return ranks, ties


def _u_counts(m: int, n: int) -> np.ndarray:
    """How many of the C(m+n, m) orderings of two samples of sizes m and n give U = 0 .. m*n:
    the coefficients of the Gaussian binomial [m+n choose m](q), as exact integers (in floats
    the subtractions left negative counts in the far tail)."""
    m, n = min(m, n), max(m, n)
    c = np.zeros(m * n + 1, dtype=object)
    c[0] = 1
    for i in range(1, m + 1):  # times (1 - q^(n+i)), then over (1 - q^i): power series
        k = n + i              # cut at q^(m*n), exact since the product is a polynomial
        c[k:] = c[k:] - c[:-k]
        for r in range(i):
            c[r::i] = np.cumsum(c[r::i])
    return c


def mann_whitney_p(x, y) -> float:
    """The two-sided p-value of scipy.stats.mannwhitneyu(x, y) (method "auto": exact when
    either sample has at most 8 values and none is tied, else the normal approximation with
    the tie correction and the continuity correction); 1 where every value is tied."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n1, n2 = x.size, y.size
    ranks, ties = _ranks(np.concatenate([x, y]))
    u1 = float(ranks[:n1].sum()) - n1 * (n1 + 1) / 2
    u = max(u1, n1 * n2 - u1)
    if (n1 > 8 and n2 > 8) or bool(np.any(ties > 1)):
        n = n1 + n2
        tie_term = float((ties.astype(float) ** 3 - ties).sum())
        s = math.sqrt(n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1))))
        if s == 0:  # every value tied: no evidence of a shift
            return 1.0
        p = 2 * 0.5 * math.erfc((u - n1 * n2 / 2 - 0.5) / s / math.sqrt(2))
    else:
        counts = _u_counts(n1, n2)
        p = 2 * (int(counts[int(u):].sum()) / math.comb(n1 + n2, n1))
    return min(max(p, 0.0), 1.0)
