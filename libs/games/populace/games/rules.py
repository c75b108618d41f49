"""Game maths, pure: no I/O, no broker. target = ratio · mean + offset; closest guess wins.

Partials make the reduction hierarchical: a host folds its agents' guesses into a
`HostPartial` (count, sum, and one entry per distinct value with its count and smallest
agent id); the environment merges partials and finds target and winner exactly without
re-reading individual guesses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from populace.core.contracts import GameConfig, HostPartial, RoundResult

# Two guesses whose distances to the target differ by less than this are a tie.
TIE_EPS = 1e-9


def target(mean: float, game: GameConfig) -> float:
    return game.ratio_value * mean + game.offset


class PartialBuilder:
    """Folds guesses into a host partial, one `add` per agent (cheap: a dict update)."""

    __slots__ = ("n", "n_valid", "total", "by_value")

    def __init__(self) -> None:
        self.n = 0
        self.n_valid = 0
        self.total = 0.0
        self.by_value: dict[float, list[int]] = {}

    def add(self, agent_id: int, value: float | None) -> None:
        self.n += 1
        if value is None:
            return
        self.n_valid += 1
        self.total += value
        slot = self.by_value.get(value)
        if slot is None:
            self.by_value[value] = [1, agent_id]
        else:
            slot[0] += 1
            if agent_id < slot[1]:
                slot[1] = agent_id

    def build(self, run_id: str, round_: int, host_id: str) -> HostPartial:
        return HostPartial(
            run_id=run_id, round=round_, host_id=host_id, n=self.n, n_valid=self.n_valid,
            total=self.total,
            by_value=[(v, c, a) for v, (c, a) in sorted(self.by_value.items())],
        )


@dataclass(frozen=True)
class Reduced:
    n: int
    n_valid: int
    total: float
    by_value: dict[float, tuple[int, int]]  # value -> (count, smallest agent id)


def merge(partials: Iterable[HostPartial]) -> Reduced:
    """Merge host (or group) partials; associative, so groups can nest."""
    n = n_valid = 0
    total = 0.0
    by_value: dict[float, tuple[int, int]] = {}
    for p in partials:
        n += p.n
        n_valid += p.n_valid
        total += p.total
        for value, count, agent in p.by_value:
            prev = by_value.get(value)
            by_value[value] = (count, agent) if prev is None else (prev[0] + count, min(prev[1], agent))
    return Reduced(n, n_valid, total, by_value)


def decide_round(run_id: str, round_: int, reduced: Reduced, game: GameConfig,
                 closed_at: float) -> RoundResult:
    """Target and winner(s) of a round. Winners are all agents at the minimal distance to the
    target; the recorded winner is the smallest agent id among them (deterministic)."""
    if reduced.n_valid == 0:
        return RoundResult(run_id=run_id, round=round_, n=reduced.n, n_valid=0, mean=None,
                           target=None, winner_agent_id=None, winner_value=None, n_winners=0,
                           closed_at=closed_at)
    mean = reduced.total / reduced.n_valid
    tgt = target(mean, game)
    best = min(abs(v - tgt) for v in reduced.by_value)
    winners = [(agent, v, count) for v, (count, agent) in reduced.by_value.items()
               if abs(v - tgt) - best <= TIE_EPS]
    agent, value, _ = min(winners)
    return RoundResult(
        run_id=run_id, round=round_, n=reduced.n, n_valid=reduced.n_valid,
        mean=mean, target=tgt, winner_agent_id=agent, winner_value=value,
        n_winners=sum(c for _, _, c in winners), closed_at=closed_at,
    )


def finite_in_range(value: float, max_value: float) -> bool:
    return math.isfinite(value) and 0.0 <= value <= max_value
