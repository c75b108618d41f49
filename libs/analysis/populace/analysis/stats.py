"""Pure statistics: summaries, Student-t confidence intervals of a mean, Wilson score intervals
of a share. No I/O; every function takes plain numbers and
returns plain dicts/floats.

Missing values (``None`` or NaN: an invalid answer) are dropped before any statistic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

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


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise AnalysisError(f"level must be between 0 and 1 (exclusive), got {level!r}")


def t_interval(mean: float, std: float | None, n: int, level: float = 0.95) -> tuple[float | None, float | None]:
    """Two-sided Student-t interval ``mean ± t(1-(1-level)/2, n-1) · std/√n``; (None, None) for n < 2."""
    _check_level(level)
    if n < 2 or std is None or mean is None:
        return None, None
    half = float(_st.t.ppf(0.5 + level / 2, n - 1)) * std / math.sqrt(n)
    return mean - half, mean + half


def mean_ci(values: Iterable[float | None] | np.ndarray, level: float = 0.95) -> dict:
    """``{"mean", "low", "high", "n", "level"}``: the mean with a two-sided Student-t
    confidence interval (n-1 degrees of freedom). ``low``/``high`` are ``None`` for n < 2,
    ``mean`` is ``None`` for n == 0. A constant sample gives low == high == mean."""
    _check_level(level)
    a = clean(values)
    n = int(a.size)
    mean = _f(a.mean()) if n else None
    std = _f(a.std(ddof=1)) if n >= 2 else None
    low, high = t_interval(mean, std, n, level)
    return {"mean": mean, "low": low, "high": high, "n": n, "level": level}


def wilson_interval(k: int, n: int, level: float = 0.95) -> tuple[float | None, float | None]:
    """Two-sided Wilson score interval of a share k/n; (None, None) for n == 0.

    Why Wilson and not the textbook Wald interval p ± z·√(p(1−p)/n): a persona group is often
    small and an option's share often near 0 or 1, where Wald's interval collapses to zero width
    (p = 0 or 1 gives [p, p]), leaves [0, 1], and covers far less than 95% of the time. Wilson's
    stays inside [0, 1], is never empty, and keeps close to its nominal coverage for small n
    (Brown, Cai & DasGupta, "Interval Estimation for a Binomial Proportion", 2001)::

        centre = (p + z²/2n) / (1 + z²/n),  half = z·√(p(1−p)/n + z²/4n²) / (1 + z²/n)
    """
    _check_level(level)
    if isinstance(k, bool) or isinstance(n, bool) or k < 0 or n < 0 or k > n:
        raise AnalysisError(f"a share needs 0 <= k <= n, got k={k!r}, n={n!r}")
    if n == 0:
        return None, None
    z = float(_st.norm.ppf(0.5 + level / 2))
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # k == 0 and k == n give exactly 0 and 1 in exact arithmetic; clamp the float rounding
    low = 0.0 if k == 0 else max(0.0, centre - half)
    high = 1.0 if k == n else min(1.0, centre + half)
    return low, high


def share_ci(k: int, n: int, level: float = 0.95) -> dict:
    """``{"share", "low", "high", "k", "n", "level"}``: the share k/n with its Wilson score
    interval (see ``wilson_interval``); share, low and high are ``None`` for n == 0."""
    low, high = wilson_interval(k, n, level)
    return {"share": k / n if n else None, "low": low, "high": high, "k": int(k), "n": int(n), "level": level}
