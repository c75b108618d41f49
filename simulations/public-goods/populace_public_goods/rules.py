"""Game maths, pure: no I/O, no broker.

payoff_i = E − c_i + m · G / k, with E the endowment, c_i agent i's contribution, G its
group's total contribution, m the multiplier and k the group's actual size (the last group
of a run may be smaller; its members share among fewer). An invalid answer counts as c_i = 0:
the agent keeps its endowment and still gets its share.

Summed over a group, payoffs are k·E − G + m·G; over every agent of a round,

    Σ payoff = E · n + (m − 1) · Σ_groups G

so the root env needs only integers (counts and the total contribution) to find the mean
payoff exactly, however the agents were spread over hosts: partials never carry floats.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from pydantic import Field

from populace.sdk import Partial, Summary


@dataclass(frozen=True, slots=True)
class GroupNews:
    """What a group's members hear once the group has settled a round (one object per group,
    shared by its members; pickled to members that run in their own process)."""

    round: int
    total: int  # the group's pot before multiplying (invalid answers count as 0)
    size: int  # the group's actual size

    @property
    def average(self) -> float:
        return self.total / self.size


def share(total: int, size: int, multiplier: Fraction) -> Fraction:
    """Each member's share of the multiplied pot, exactly."""
    return multiplier * total / size


def payoff(endowment: int, contribution: int | None, group_share: Fraction) -> float:
    """E − c + share, correctly rounded from the exact value (integer arithmetic: cheap, and
    the same on every host). None (an invalid answer) contributes 0."""
    kept = endowment - (contribution or 0)
    q = group_share.denominator
    return (kept * q + group_share.numerator) / q


def settle_group(contributions: Sequence[int | None], endowment: int,
                 multiplier: Fraction) -> tuple[int, list[float]]:
    """(the group's total, each member's payoff) for one group's contributions, in order."""
    total = sum(c for c in contributions if c is not None)
    s = share(total, len(contributions), multiplier)
    return total, [payoff(endowment, c, s) for c in contributions]


class GoodsPartial(Partial):
    """A batch's, host's or the whole round's contributions, as integers only (exact)."""

    n: int = 0  # agents settled (every member of every group: invalid ones too)
    n_valid: int = 0  # valid answers
    total: int = 0  # Σ valid contributions = Σ group pots (invalid answers count as 0)
    free_riders: int = 0  # valid answers of 0
    full: int = 0  # valid answers of the whole endowment
    groups: int = 0  # groups whose first member is in here (each group is counted once)


class RoundSummary(Summary):
    """The columns of table `public_goods_rounds` (besides n and n_valid)."""

    mean_contribution: float | None = Field(None, title="mean contribution")  # over valid answers
    mean_payoff: float | None = Field(None, title="mean payoff")  # over every agent
    total_contribution: int = Field(0, title="total contributed")  # Σ valid contributions
    groups: int = Field(0, title="groups")
    free_riders: float | None = Field(None, title="free riders (share)")  # of valid answers: 0
    full_contributors: float | None = Field(None, title="full contributors (share)")  # of valid: E


def partial_of(agent_ids: Sequence[int], contributions: Iterable[int | None], endowment: int,
               group_size: int) -> GoodsPartial:
    """Fold a batch's (agent id, valid contribution or None) into a partial. A batch may cut a
    group in two, so a group is counted where its first member (id % k == 0) is."""
    n = n_valid = total = free = full = 0
    for c in contributions:
        n += 1
        if c is None:
            continue
        n_valid += 1
        total += c
        if c == 0:
            free += 1
        elif c == endowment:
            full += 1
    groups = sum(1 for a in agent_ids if a % group_size == 0)
    return GoodsPartial.model_construct(n=n, n_valid=n_valid, total=total, free_riders=free, full=full,
                                        groups=groups)


def merge(partials: Iterable[GoodsPartial]) -> GoodsPartial:
    """Integer sums: associative and commutative, so batches, hosts and groups nest freely."""
    n = n_valid = total = free = full = groups = 0
    for p in partials:
        n += p.n
        n_valid += p.n_valid
        total += p.total
        free += p.free_riders
        full += p.full
        groups += p.groups
    return GoodsPartial.model_construct(n=n, n_valid=n_valid, total=total, free_riders=free, full=full,
                                        groups=groups)


def mean_payoff(n: int, total: int, endowment: int, multiplier: Fraction) -> Fraction:
    """(E·n + (m − 1)·Σ G) / n: the exact mean of every agent's payoff (see the module doc)."""
    return (endowment * n + (multiplier - 1) * total) / n


def decide_round(total: GoodsPartial, endowment: int, multiplier: Fraction) -> RoundSummary:
    """The round's summary from the merged partial: every float is made here, once, from exact
    integers (shares of valid answers; the mean payoff over every agent)."""
    v = total.n_valid
    return RoundSummary(
        mean_contribution=float(Fraction(total.total, v)) if v else None,
        mean_payoff=float(mean_payoff(total.n, total.total, endowment, multiplier)) if total.n else None,
        total_contribution=total.total,
        groups=total.groups,
        free_riders=total.free_riders / v if v else None,
        full_contributors=total.full / v if v else None,
    )


def equilibrium(endowment: int, multiplier: Fraction, group_size: int) -> float | None:
    """The Nash contribution of one-shot (and finitely repeated) play in a full group: a token
    put in returns m/k to its giver. m < k: give nothing (free riding); m > k: give everything;
    m == k: indifferent (None). A smaller last group (k' ≤ m) has its own answer."""
    if multiplier < group_size:
        return 0.0
    if multiplier > group_size:
        return float(endowment)
    return None
