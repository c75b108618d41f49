"""Pure statistics for the guessing game: summaries, Student-t confidence intervals, and the
game's equilibrium. No I/O; every function takes plain numbers and returns plain dicts/floats.

Missing values (``None`` or NaN: an invalid answer) are dropped before any statistic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction

import numpy as np
from scipy import stats as _st


class AnalysisError(ValueError):
    """A request the analysis cannot answer (unknown run, attribute or round, bad argument).
    The message says what was asked and what is available."""


def clean(values: Iterable[float | None] | np.ndarray) -> np.ndarray:
    """``values`` as a float array without ``None``/NaN/±inf."""
    if isinstance(values, np.ndarray):
        arr = values.astype(float, copy=False)
    else:
        arr = np.array([math.nan if v is None else float(v) for v in values], dtype=float)
    return arr[np.isfinite(arr)]


def _f(x: float) -> float:
    return float(x)


def summary(values: Iterable[float | None] | np.ndarray) -> dict:
    """``{"n", "mean", "median", "std", "min", "max"}`` of the valid values.

    ``std`` is the sample standard deviation (ddof=1), ``None`` for n < 2; every other
    statistic is ``None`` for n == 0.
    """
    a = clean(values)
    n = int(a.size)
    if n == 0:
        return {"n": 0, "mean": None, "median": None, "std": None, "min": None, "max": None}
    return {
        "n": n,
        "mean": _f(a.mean()),
        "median": _f(np.median(a)),
        "std": _f(a.std(ddof=1)) if n >= 2 else None,
        "min": _f(a.min()),
        "max": _f(a.max()),
    }


def t_interval(mean: float, std: float | None, n: int, level: float = 0.95) -> tuple[float | None, float | None]:
    """Two-sided Student-t interval ``mean ± t(1-(1-level)/2, n-1) · std/√n``; (None, None) for n < 2."""
    if not 0 < level < 1:
        raise AnalysisError(f"level must be between 0 and 1 (exclusive), got {level!r}")
    if n < 2 or std is None or mean is None:
        return None, None
    half = float(_st.t.ppf(0.5 + level / 2, n - 1)) * std / math.sqrt(n)
    return mean - half, mean + half


def mean_ci(values: Iterable[float | None] | np.ndarray, level: float = 0.95) -> dict:
    """``{"mean", "low", "high", "n", "level"}``: the mean with a two-sided Student-t
    confidence interval (n-1 degrees of freedom). ``low``/``high`` are ``None`` for n < 2,
    ``mean`` is ``None`` for n == 0. A constant sample gives low == high == mean."""
    if not 0 < level < 1:
        raise AnalysisError(f"level must be between 0 and 1 (exclusive), got {level!r}")
    a = clean(values)
    n = int(a.size)
    mean = _f(a.mean()) if n else None
    std = _f(a.std(ddof=1)) if n >= 2 else None
    low, high = t_interval(mean, std, n, level)
    return {"mean": mean, "low": low, "high": high, "n": n, "level": level}


def as_fraction(ratio: str | float | int | Fraction) -> Fraction:
    """'2/3', '0.5', 0.5 or Fraction → Fraction (exact for strings)."""
    if isinstance(ratio, Fraction):
        return ratio
    if isinstance(ratio, bool):
        raise AnalysisError(f"ratio must be a number or a fraction like '2/3', got {ratio!r}")
    try:
        return Fraction(ratio.strip()) if isinstance(ratio, str) else Fraction(ratio)
    except (ValueError, ZeroDivisionError, TypeError):
        raise AnalysisError(f"ratio must be a number or a fraction like '2/3', got {ratio!r}") from None


def equilibrium(ratio: str | float | Fraction, offset: float = 0.0, max_value: float = 100.0) -> float | None:
    """The Nash equilibrium (the common guess) of the game target = ratio · mean + offset,
    guesses in [0, max_value].

    - ratio < 1: the fixed point x = offset / (1 - ratio), clipped to [0, max_value]
      (2/3 → 0; 5 + ½·mean → 10).
    - ratio > 1: max_value when everyone at max_value still undershoots the target
      (ratio·max + offset ≥ max, e.g. any offset ≥ 0); otherwise there is no unique
      equilibrium → None.
    - ratio == 1: offset > 0 → max_value, offset < 0 → 0, offset == 0 → None (every common
      value is an equilibrium).
    """
    r = as_fraction(ratio)
    off = float(offset)
    hi = float(max_value)
    if r < 1:
        x = off / float(1 - r)
        return min(max(x, 0.0), hi)
    if r == 1:
        if off == 0:
            return None
        return hi if off > 0 else 0.0
    return hi if float(r) * hi + off >= hi else None
