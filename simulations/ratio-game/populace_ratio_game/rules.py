"""Game maths, pure: no I/O, no broker. target = ratio · mean + offset; closest guess wins.

Partials make the reduction hierarchical: a host folds its agents' guesses into a
`GuessPartial` (count, sum, and one entry per distinct value with its count and smallest
agent id); the environment merges partials and finds target and winner exactly without
re-reading individual guesses. Guesses are integers on the dummy model, so sums are exact
and the result is the same however the agents were spread over hosts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from pydantic import Field

from populace.sdk import Partial, Summary
from populace_ratio_game.params import GameConfig

# Two guesses whose distances to the target differ by less than this are a tie.
TIE_EPS = 1e-9


class GuessPartial(Partial):
    """`by_value`: one entry per distinct guessed value: (value, count, smallest agent id)."""

    n_valid: int = 0
    total: float = 0.0  # sum of valid values
    by_value: list[tuple[float, int, int]] = []


class RoundSummary(Summary):
    """The columns of table `rounds` (besides n and n_valid)."""

    mean: float | None = None
    target: float | None = None
    winner_agent_id: int | None = Field(None, title="winner")
    winner_value: float | None = Field(None, title="winning number")
    n_winners: int = Field(0, title="winners")


def target(mean: float, game: GameConfig) -> float:
    return game.ratio_value * mean + game.offset


def partial_of(guesses: Iterable[tuple[int, float | None]]) -> GuessPartial:
    """Fold (agent id, valid value or None) pairs into a partial."""
    n_valid = 0
    total = 0.0
    by_value: dict[float, list[int]] = {}
    for agent_id, value in guesses:
        if value is None:
            continue
        n_valid += 1
        total += value
        slot = by_value.get(value)
        if slot is None:
            by_value[value] = [1, agent_id]
        else:
            slot[0] += 1
            if agent_id < slot[1]:
                slot[1] = agent_id
    return GuessPartial.model_construct(n_valid=n_valid, total=total,
                                        by_value=[(v, c, a) for v, (c, a) in sorted(by_value.items())])


def partial_of_drawn(guesses: Iterable[tuple[int, float | None, int]]) -> GuessPartial:
    """Fold (smallest agent id, valid value or None, how many agents) triples: the answers a
    prototype run's agents drew, each once with its count (the same partial as folding every
    agent's copy one by one)."""
    n_valid = 0
    total = 0.0
    by_value: dict[float, list[int]] = {}
    for agent_id, value, count in guesses:
        if value is None or count <= 0:
            continue
        n_valid += count
        total += value * count
        slot = by_value.get(value)
        if slot is None:
            by_value[value] = [count, agent_id]
        else:
            slot[0] += count
            if agent_id < slot[1]:
                slot[1] = agent_id
    return GuessPartial.model_construct(n_valid=n_valid, total=total,
                                        by_value=[(v, c, a) for v, (c, a) in sorted(by_value.items())])


def merge(partials: Iterable[GuessPartial]) -> GuessPartial:
    """Merge host (or group) partials; associative and commutative, so groups can nest."""
    n_valid = 0
    total = 0.0
    by_value: dict[float, tuple[int, int]] = {}
    for p in partials:
        n_valid += p.n_valid
        total += p.total
        for value, count, agent in p.by_value:
            prev = by_value.get(value)
            by_value[value] = (count, agent) if prev is None else (prev[0] + count, min(prev[1], agent))
    return GuessPartial.model_construct(n_valid=n_valid, total=total,
                                        by_value=[(v, c, a) for v, (c, a) in sorted(by_value.items())])


def decide_round(total: GuessPartial, game: GameConfig) -> RoundSummary:
    """Target and winner(s) of a round. Winners are all agents at the minimal distance to the
    target; the recorded winner is the smallest agent id among them (deterministic)."""
    if total.n_valid == 0:
        return RoundSummary()
    mean = total.total / total.n_valid
    tgt = target(mean, game)
    best = min(abs(v - tgt) for v, _, _ in total.by_value)
    winners = [(agent, v, count) for v, count, agent in total.by_value if abs(v - tgt) - best <= TIE_EPS]
    agent, value, _ = min(winners)
    return RoundSummary(mean=mean, target=tgt, winner_agent_id=agent, winner_value=value,
                        n_winners=sum(c for _, _, c in winners))


def finite_in_range(value: float, max_value: float) -> bool:
    return math.isfinite(value) and 0.0 <= value <= max_value


def equilibrium(game: GameConfig) -> float | None:
    """The Nash equilibrium (the common guess) of target = ratio · mean + offset, guesses in
    [0, max_value].

    - ratio < 1: the fixed point x = offset / (1 - ratio), clipped to [0, max_value]
      (2/3 → 0; 5 + ½·mean → 10).
    - ratio > 1: max_value when everyone at max_value still undershoots the target
      (ratio·max + offset ≥ max); otherwise there is no unique equilibrium → None.
    - ratio == 1: offset > 0 → max_value, offset < 0 → 0, offset == 0 → None (every common
      value is an equilibrium).
    """
    r = game.ratio_fraction
    off, hi = float(game.offset), float(game.max_value)
    if r < 1:
        return min(max(off / float(1 - r), 0.0), hi)
    if r == 1:
        if off == 0:
            return None
        return hi if off > 0 else 0.0
    return hi if float(r) * hi + off >= hi else None


def _num_text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def describe(game: GameConfig) -> str:
    """'target = 2/3 · mean + 5; guesses in [0, 100]', the ratio as the scenario wrote it."""
    t = f"target = {game.ratio} · mean"
    if game.offset:
        t += f" {'+' if game.offset > 0 else '−'} {_num_text(abs(game.offset))}"
    return f"{t}; guesses in [0, {_num_text(game.max_value)}]"
