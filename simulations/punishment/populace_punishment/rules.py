"""The game's arithmetic, pure: no I/O, no broker.

A member's payoff in a round, with E the endowment, c its contribution (an invalid answer
counts as 0), G its group's total, k the group's actual size, m the multiplier, g the points
it assigned and r the points it received:

    payoff = E − c + m · G / k − cost · g − fine · r

Summed over a group the shares give m · G, and every point assigned is a point received, so
over every agent of a round

    Σ payoff = E · n + (m − 1) · Σ G − (cost + fine) · Σ points

and the root env finds the mean payoff exactly from integer counts, however the agents were
spread over hosts: partials never carry floats. A payoff may be negative (punishment is not
capped at what a member earned), as in Fehr & Gächter's linear-cost designs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import NamedTuple

from pydantic import Field

from populace.sdk import Partial, Summary


class Terms(NamedTuple):
    """The round's prices, the same for every group of a run."""

    endowment: int
    multiplier: Fraction
    cost: int
    fine: int


def payoff(terms: Terms, contribution: int | None, total: int, size: int, given: int, received: int) -> float:
    """One member's payoff, correctly rounded from its exact value (integer arithmetic: the same
    on every host, and cheap enough for a million members a round)."""
    den = terms.multiplier.denominator * size
    kept = terms.endowment - (contribution or 0) - terms.cost * given - terms.fine * received
    return (kept * den + terms.multiplier.numerator * total) / den


def first_stage(terms: Terms, contribution: int | None, total: int, size: int) -> float:
    """What a member holds after the pot is shared, before any punishment."""
    return payoff(terms, contribution, total, size, 0, 0)


def others(me: int, size: int) -> list[int]:
    """The seats (positions in the group) of the members `me` may punish, in the group's order."""
    return list(other_seats(size)[me]) if 0 <= me < size else list(range(size))


@functools.cache
def other_seats(size: int) -> tuple[tuple[int, ...], ...]:
    """For each seat of a group of `size`, the seats of the others (`others`), made once per size:
    read for every member twice a round."""
    return tuple(tuple(j for j in range(size) if j != me) for me in range(size))


class Punish(NamedTuple):
    """What the punishment stage shows a member: the group's contributions of this round."""

    seat: int  # the member's own position in the group
    members: tuple[int, ...]  # the group's agent ids, in the group's order
    contributions: tuple[int | None, ...]  # each one's valid contribution (None: invalid, counted as 0)

    @property
    def total(self) -> int:
        return sum(c or 0 for c in self.contributions)

    @property
    def targets(self) -> list[int]:
        """The agent ids this member may punish, in the order of its answer's letters."""
        members = self.members
        return list(map(members.__getitem__, other_seats(len(members))[self.seat]))


class Settlement(NamedTuple):
    """One group's round, each list in the group's order."""

    total: int  # the pot before multiplying (invalid contributions count as 0)
    given: list[int]  # points each member assigned
    antisocial: list[int]  # of those, points to members who contributed as much as it or more
    received: list[int]  # points each member received
    payoffs: list[float]


def settle_group(terms: Terms, contributions: Sequence[int | None],
                 points: Sequence[Sequence[int] | None]) -> Settlement:
    """`contributions[i]`: member i's valid contribution or None (counted as 0); `points[i]`: the
    points member i assigned to each other member (`others(i, k)`, in order), or None (no valid
    punishment: it assigned nothing)."""
    k = len(contributions)
    counted = [c or 0 for c in contributions]
    total = sum(counted)
    given, antisocial, received = [0] * k, [0] * k, [0] * k
    seats = other_seats(k)
    for i in range(k):
        row = points[i]
        if row is None:
            continue
        mine = counted[i]
        g = a = 0
        for target, p in zip(seats[i], row):
            g += p
            received[target] += p
            if counted[target] >= mine:
                a += p
        given[i], antisocial[i] = g, a
    # payoff() for each member, its terms read once per group (a Fraction's parts are properties)
    den = terms.multiplier.denominator * k
    pot = terms.multiplier.numerator * total
    endowment, cost, fine = terms.endowment, terms.cost, terms.fine
    payoffs = []
    for i in range(k):  # a loop: a comprehension's closure would cost objects per group
        payoffs.append(((endowment - counted[i] - cost * given[i] - fine * received[i]) * den + pot) / den)
    return Settlement(total, given, antisocial, received, payoffs)


class Counts(Partial):
    """A batch's, host's or the whole round's counts, integers only (exact)."""

    n: int = 0  # agents settled (invalid answers too)
    n_valid: int = 0  # valid contributions
    total: int = 0  # Σ valid contributions = Σ group pots
    free_riders: int = 0  # valid contributions of 0
    punish_answers: int = 0  # valid punishment answers
    punishers: int = 0  # of those, answers that assigned at least one point
    points: int = 0  # points assigned (= points received)
    antisocial: int = 0  # of those, points to members who contributed as much as the punisher or more


def merge(parts: Iterable[Counts]) -> Counts:
    """Integer sums: associative and commutative, so batches and hosts nest freely."""
    total = dict.fromkeys(Counts.model_fields, 0)
    for p in parts:
        for name in total:
            total[name] += getattr(p, name)
    return Counts.model_construct(**total)


class RoundSummary(Summary):
    """The columns of table `punishment_rounds` (besides the platform's n, n_valid …)."""

    mean_contribution: float | None = Field(None, title="mean contribution")  # over valid contributions
    mean_payoff: float | None = Field(None, title="mean payoff")  # over every agent
    free_riders: float | None = Field(None, title="free riders (share)")  # of valid contributions: 0
    punish_answers: int = Field(0, title="punishment answers")  # valid ones
    share_punishing: float | None = Field(None, title="punishing (share)")  # of valid answers: ≥ 1 point
    mean_points: float | None = Field(None, title="points per answer")  # assigned, per valid answer
    antisocial_share: float | None = Field(None, title="antisocial (share of points)")


def mean_payoff(total: Counts, terms: Terms) -> Fraction:
    """The exact mean of every agent's payoff, from integer counts (see the module doc)."""
    return (terms.endowment * total.n + (terms.multiplier - 1) * total.total
            - (terms.cost + terms.fine) * total.points) / total.n


def summary(total: Counts, terms: Terms) -> RoundSummary:
    """Every float is made here, once, from exact integers."""
    v, a = total.n_valid, total.punish_answers
    return RoundSummary(
        mean_contribution=total.total / v if v else None,
        mean_payoff=float(mean_payoff(total, terms)) if total.n else None,
        free_riders=total.free_riders / v if v else None,
        punish_answers=a,
        share_punishing=total.punishers / a if a else None,
        mean_points=total.points / a if a else None,
        antisocial_share=total.antisocial / total.points if total.points else None,
    )


def equilibrium(endowment: int, multiplier: Fraction, group_size: int) -> float | None:
    """The contribution of selfish players who know the others are selfish: punishing costs its
    giver and repays nothing, so nobody punishes, and the game is the public-goods game's (m < k:
    give nothing; m > k: give everything; m == k: indifferent, None)."""
    if multiplier < group_size:
        return 0.0
    if multiplier > group_size:
        return float(endowment)
    return None
