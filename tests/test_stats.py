"""analysis.stats against scipy.stats itself: Student's t (ppf, sf) and the two-sided
Mann-Whitney U p-value, exact and asymptotic, with and without ties."""
import math

import numpy as np
import pytest
from scipy import stats as sps

from harness.analysis.stats import mann_whitney_p, t_ppf, t_sf


@pytest.mark.parametrize("df", [1, 2, 3, 5, 11, 29, 30, 64, 100.5])
def test_student_t_is_scipys(df):
    for q in (0.5, 0.8, 0.9, 0.975, 0.995, 0.9995):
        assert t_ppf(q, df) == pytest.approx(float(sps.t.ppf(q, df)), rel=1e-13)
    for x in (-4.0, -1.0, 0.0, 0.3, 2.0, 6.0, 40.0):
        assert t_sf(x, df) == pytest.approx(float(sps.t.sf(x, df)), rel=1e-12, abs=1e-300)


def _p(x, y) -> float:
    return float(sps.mannwhitneyu(x, y, alternative="two-sided").pvalue)


def test_mann_whitney_is_scipys_on_random_samples():
    rng = np.random.default_rng(7)
    methods = set()
    for trial in range(1500):
        n1 = int(rng.integers(1, 20))
        n2 = int(rng.integers(1, 9 if trial % 3 == 0 else 20))
        x = rng.normal(0, 1, n1)
        y = rng.normal(rng.normal(0, 1.5), 1, n2)
        if trial % 4 == 0:  # ties: timings at the clock's resolution
            x, y = np.round(x, 1), np.round(y, 1)
        ties = len(np.unique(np.r_[x, y])) < n1 + n2
        methods.add("asymptotic" if (n1 > 8 and n2 > 8) or ties else "exact")
        assert mann_whitney_p(x, y) == pytest.approx(_p(x, y), rel=1e-12), (x, y)
    assert methods == {"exact", "asymptotic"}


@pytest.mark.parametrize("n1,n2", [(1, 1), (1, 7), (8, 8), (3, 500), (8, 300), (8, 3000),
                                   (9, 9)])
def test_mann_whitney_edges(n1, n2):
    rng = np.random.default_rng(n1 * 1000 + n2)
    x, y = rng.normal(0, 1, n1), rng.normal(0.4, 1, n2)
    assert mann_whitney_p(x, y) == pytest.approx(_p(x, y), rel=1e-10)
    far = y + 100  # wholly apart: the smallest p there is (1.2e-23 at 8 and 3000 values:
    assert mann_whitney_p(x, far) == pytest.approx(_p(x, far), rel=1e-10)  # exact counts)


def test_mann_whitney_all_tied_is_one():
    assert mann_whitney_p([1.0] * 12, [1.0] * 12) == 1.0 == _p([1.0] * 12, [1.0] * 12)
    assert mann_whitney_p([2.0] * 3, [2.0] * 4) == 1.0 == _p([2.0] * 3, [2.0] * 4)
    assert not math.isnan(mann_whitney_p([1.0, 1.0], [1.0, 2.0]))
