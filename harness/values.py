"""Small value helpers shared by the table/report/dashboard code."""
from __future__ import annotations

import math


def finite(x) -> float | None:
    """x as a float, or None when it is missing, not a number, or NaN (parquet nulls)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v
