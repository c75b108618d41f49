"""A round's statistics of the stances, pure: no I/O, no broker.

A host folds its agents' valid stances (in micro-units, see scale.py) into `StanceSums`:
integer counts and sums only. The environment adds the hosts' sums up and divides once, in
`summarize`. Integer sums are exact, associative and commutative, so a run gives identical
rounds on one host or on many, however its agents were spread and in whatever order the
partials arrive.

The columns of `opinion_rounds` (n valid stances s_i; invalid answers are left out):
- mean_stance: the mean of s_i.
- var_stance: the population variance, mean of (s_i - mean)^2 (divided by n, not n - 1).
- extreme_share: the share of the s_i with |s_i| >= `extreme`.
- polarization: the distance between the two camps, weighted by their sizes:
  2 * p+ * p- * (m+ - m-), where p+ and p- are the shares of the n stances above and below 0
  (neutral stances count in n but in neither camp) and m+, m- the camps' means. 0 when
  everyone is on one side or neutral, 1 when half stand at +1 and half at -1; a spread-out
  but one-sided population scores 0, however large its variance.
- assortativity: the Pearson correlation, over the graph's edges that carried a post, between
  the hearer's stance this round and the stance of the post it heard (written in the round
  before). One pair per post an agent heard from an in-neighbour (broadcasts excluded), the
  hearer's answer valid. Positive: agents end up near what they heard (echo chambers, or
  homophily in who hears whom); negative: they turn against it. None when undefined: round 1
  (nothing heard yet), fewer than two pairs, or no variance on either side.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction

from pydantic import Field

from populace.sdk import Partial, Summary
from populace_opinion.hearing import Listened
from populace_opinion.scale import MICRO


class StanceSums(Partial):
    """Counts and sums of the valid stances (micro-units), and of the (hearer, heard) pairs."""

    n: int = 0
    total: int = 0
    squares: int = 0
    extreme: int = 0  # stances with |s| >= the run's `extreme`
    n_pos: int = 0
    total_pos: int = 0
    n_neg: int = 0
    total_neg: int = 0
    # the pairs (x: the hearer's stance now, y: the stance of a post it heard)
    pairs: int = 0
    x: int = 0
    xx: int = 0
    y: int = 0
    yy: int = 0
    xy: int = 0


class OpinionSummary(Summary):
    """The columns of table `opinion_rounds` (besides n and n_valid); see the module docstring."""

    mean_stance: float | None = Field(None, title="mean stance")
    var_stance: float | None = Field(None, title="stance variance")
    extreme_share: float | None = Field(None, title="extreme share")
    polarization: float | None = Field(None, title="polarization")
    assortativity: float | None = Field(None, title="assortativity")


def fold(stances: Iterable[tuple[int | None, Listened]], extreme: int) -> StanceSums:
    """Fold (stance in micro-units or None, what that agent heard) pairs into sums; `extreme`
    is the run's threshold in micro-units."""
    n = total = squares = ext = n_pos = total_pos = n_neg = total_neg = 0
    pairs = x = xx = y = yy = xy = 0
    for s, heard in stances:
        if s is None:
            continue
        n += 1
        total += s
        squares += s * s
        if abs(s) >= extreme:
            ext += 1
        if s > 0:
            n_pos += 1
            total_pos += s
        elif s < 0:
            n_neg += 1
            total_neg += s
        k = heard.n
        if k:
            pairs += k
            x += k * s
            xx += k * s * s
            y += heard.total
            yy += heard.squares
            xy += s * heard.total
    return StanceSums.model_construct(n=n, total=total, squares=squares, extreme=ext, n_pos=n_pos,
                                      total_pos=total_pos, n_neg=n_neg, total_neg=total_neg, pairs=pairs,
                                      x=x, xx=xx, y=y, yy=yy, xy=xy)


def merge(partials: Iterable[StanceSums]) -> StanceSums:
    """Add sums up (batches, hosts alike). No partials: all zeros."""
    names = list(StanceSums.model_fields)
    sums = dict.fromkeys(names, 0)
    for p in partials:
        for name in names:
            sums[name] += getattr(p, name)
    return StanceSums.model_construct(**sums)


def pearson(n: int, sx: int, sxx: int, sy: int, syy: int, sxy: int) -> float | None:
    """Pearson's r from exact sums; None when undefined. One rounding, at the very end."""
    if n < 2:
        return None
    dx, dy = n * sxx - sx * sx, n * syy - sy * sy
    if dx <= 0 or dy <= 0:
        return None
    r = (n * sxy - sx * sy) / math.sqrt(dx * dy)
    return max(-1.0, min(1.0, r))


def summarize(total: StanceSums) -> OpinionSummary:
    n = total.n
    if n == 0:
        return OpinionSummary()
    return OpinionSummary(
        mean_stance=float(Fraction(total.total, n * MICRO)),
        var_stance=float(Fraction(n * total.squares - total.total ** 2, n * n * MICRO * MICRO)),
        extreme_share=total.extreme / n,
        polarization=float(Fraction(2 * (total.n_neg * total.total_pos - total.n_pos * total.total_neg),
                                    n * n * MICRO)),
        assortativity=pearson(total.pairs, total.x, total.xx, total.y, total.yy, total.xy),
    )
