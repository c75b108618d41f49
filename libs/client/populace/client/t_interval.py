"""A Student-t confidence interval of a mean, in plain Python (a sweep's CI across seeds).

The client needs one such interval per sweep cell; `populace.analysis.stats.mean_ci` gives the
same figures with scipy, which the client (imported by the manager and by notebooks) does not
carry for one quantile. For whole degrees of freedom the t distribution's CDF is a finite sum
(Abramowitz & Stegun 26.7.3 and 26.7.4), so the quantile is exact to float precision by bisection.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def _central(theta: float, df: int) -> float:
    """P(|T| ≤ t) for T ~ Student-t with `df` degrees of freedom, where t = √df · tan(theta)."""
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:  # odd: 2/π (θ + sinθ cosθ (1 + 2/3 cos²θ + 2·4/(3·5) cos⁴θ + …)), df − 3 in the last factor
        term = total = 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + s * math.cos(theta) * total)
    term = total = 1.0  # even: sinθ (1 + 1/2 cos²θ + 1·3/(2·4) cos⁴θ + …), df − 2 in the last factor
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return s * total


def t_quantile(level: float, df: int) -> float:
    """The two-sided critical value t with P(|T| ≤ t) = `level` (e.g. 4.303 for 0.95 and 2 df)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be between 0 and 1 (exclusive), got {level!r}")
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df!r}")
    lo, hi = 0.0, math.pi / 2
    for _ in range(200):  # bisection on θ ∈ (0, π/2), where the probability rises monotonically
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if _central(mid, df) < level else (lo, mid)
    return math.sqrt(df) * math.tan((lo + hi) / 2)


def mean_ci(values: Iterable[float | None], level: float = 0.95) -> dict:
    """``{"mean", "low", "high", "n"}``: the mean of the finite values (None and NaN dropped) with
    a two-sided Student-t interval on n − 1 degrees of freedom; low/high None for n < 2, mean None
    for n == 0 (as populace.analysis.stats.mean_ci)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(xs)
    if n == 0:
        return {"mean": None, "low": None, "high": None, "n": 0}
    mean = math.fsum(xs) / n
    if n < 2:
        return {"mean": mean, "low": None, "high": None, "n": 1}
    half = t_quantile(level, n - 1) * math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1) / n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}
