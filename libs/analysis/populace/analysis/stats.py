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

from populace.store.tables import QueryError

# A request the analysis cannot answer (unknown run, attribute or round, bad argument): the
# store's own read error, so that one `except` catches a refusal of either.
AnalysisError = QueryError


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


def median_ranks(n: int, level: float = 0.95) -> tuple[int, int] | None:
    """The 1-based ranks (j, k) of the order statistics that bound a distribution-free confidence
    interval of a median, [x_(j), x_(k)], with coverage at least `level`: the number of values
    below the true median is Binomial(n, ½), so P(j <= B < k) = P(x_(j) <= median < x_(k)). None
    when n is too small for any such interval (n < 6 at 95%)."""
    _check_level(level)
    if n < 1:
        return None
    alpha = 1 - level
    j = int(_st.binom.ppf(alpha / 2, n, 0.5))  # the largest j with P(B < j) <= α/2 …
    while j > 0 and _st.binom.cdf(j - 1, n, 0.5) > alpha / 2:
        j -= 1
    while _st.binom.cdf(j, n, 0.5) <= alpha / 2:
        j += 1
    k = n - j + 1  # symmetric
    if j < 1 or k > n or j >= k:
        return None
    return j, k


def histogram_summary(values: np.ndarray, weights: np.ndarray, level: float = 0.95) -> dict:
    """``{"n", "mean", "mean_low", "mean_high", "median", "median_low", "median_high", "sd"}`` of a
    sample given as distinct values and their counts: the mean with its Student-t interval, the
    median (the midpoint of the two middle values for an even n) with its distribution-free
    order-statistic interval (`median_ranks`). Whole counts; None where n is too small."""
    _check_level(level)
    order = np.argsort(values, kind="stable")
    xs, ws = np.asarray(values, dtype=float)[order], np.asarray(weights, dtype=float)[order]
    keep = ws > 0
    xs, ws = xs[keep], ws[keep]
    n = round(float(ws.sum()))
    out: dict = dict.fromkeys(("mean", "mean_low", "mean_high", "median", "median_low", "median_high", "sd"))
    out["n"] = n
    if n == 0:
        return out
    cum = np.cumsum(ws)

    def at(rank: int) -> float:  # the rank-th smallest value, 1-based
        return float(xs[int(np.searchsorted(cum, rank - 0.5))])

    mean = float(np.dot(xs, ws) / n)
    sd = float(math.sqrt(np.dot(ws, (xs - mean) ** 2) / (n - 1))) if n >= 2 else None
    low, high = t_interval(mean, sd, n, level)
    out.update(mean=mean, mean_low=low, mean_high=high, sd=sd,
               median=(at((n + 1) // 2) + at(n // 2 + 1)) / 2)
    ranks = median_ranks(n, level)
    if ranks is not None:
        out.update(median_low=at(ranks[0]), median_high=at(ranks[1]))
    return out
