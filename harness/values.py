"""Small value helpers shared by the table/report/dashboard code."""
from __future__ import annotations

import math

from harness.errors import HarnessError


def finite(x) -> float | None:
    """x as a float, or None when it is missing, not a number, or NaN (parquet nulls)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def same_cell(a, b) -> bool:
    """Two table cells are the same: both missing (None, NaN: parquet nulls) or equal as text."""
    missing = [v is None or (isinstance(v, float) and math.isnan(v)) for v in (a, b)]
    return all(missing) or (not any(missing) and str(a) == str(b))


def parse_pct(text: str, flag: str = "--fail-on-regression") -> float:
    """'5%' or '5' -> 0.05 (percent)."""
    t = str(text).strip().removesuffix("%").strip()
    try:
        v = float(t)
    except ValueError:
        raise HarnessError(f"{flag}: expected a percentage like 5% , got {text!r}") from None
    if not 0 <= v < 1000 or math.isnan(v):
        raise HarnessError(f"{flag}: {text!r} is not a percentage in [0, 1000)")
    return v / 100
