"""Game maths: host partials merged by the environment must give exactly what a brute-force
computation over the flat list of guesses gives."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from populace_ratio_game.params import GameConfig
from populace_ratio_game.rules import (
    TIE_EPS,
    GuessPartial,
    decide_round,
    describe,
    equilibrium,
    merge,
    partial_of,
    target,
)

Guess = tuple[int, float | None]  # (agent_id, value or None when invalid)


# --- independent reference ---------------------------------------------------------------
def brute_force(guesses: list[Guess], ratio: str, offset: float) -> dict:
    """Exact (Fraction) computation straight from the list; no partials, no floats."""
    valid = [(a, Fraction(v)) for a, v in guesses if v is not None]
    if not valid:
        return {"n": len(guesses), "n_valid": 0, "mean": None, "target": None,
                "winner_agent_id": None, "winner_value": None, "n_winners": 0}
    mean = sum(v for _, v in valid) / len(valid)
    tgt = Fraction(ratio) * mean + Fraction(offset)
    best = min(abs(v - tgt) for _, v in valid)
    winners = sorted((a, v) for a, v in valid if abs(v - tgt) == best)
    return {"n": len(guesses), "n_valid": len(valid), "mean": float(mean), "target": float(tgt),
            "winner_agent_id": winners[0][0], "winner_value": float(winners[0][1]),
            "n_winners": len(winners)}


def random_guesses(rng: random.Random, n: int, invalid_share: float = 0.2) -> list[Guess]:
    # Integers and halves: sums are exact in binary floating point, so the float pipeline and the
    # exact reference must agree to the last bit on the mean.
    ids = rng.sample(range(10 * n), n)
    out: list[Guess] = []
    for a in ids:
        if rng.random() < invalid_share:
            out.append((a, None))
        else:
            out.append((a, rng.randint(0, 200) / 2))
    return out


def split(guesses: list[Guess], how: str, rng: random.Random) -> list[list[Guess]]:
    if how == "one_host":
        return [list(guesses)]
    if how == "contiguous":
        k = rng.randint(2, 7)
        size = -(-len(guesses) // k)
        return [guesses[i:i + size] for i in range(0, len(guesses), size)]
    if how == "random":
        k = rng.randint(2, 9)
        parts: list[list[Guess]] = [[] for _ in range(k)]
        for g in guesses:
            parts[rng.randrange(k)].append(g)
        return parts
    if how == "one_per_agent":
        return [[g] for g in guesses]
    raise AssertionError(how)


def partials_of(parts: list[list[Guess]]) -> list[GuessPartial]:
    return [partial_of(part) for part in parts]


class Decided:
    """A round as the platform records it: its counts plus the game's summary."""

    def __init__(self, parts: list[list[Guess]], game: GameConfig, merged: GuessPartial | None = None) -> None:
        merged = merged if merged is not None else merge(partials_of(parts))
        self.n = sum(len(p) for p in parts)
        self.n_valid = merged.n_valid
        s = decide_round(merged, game)
        self.mean, self.target, self.n_winners = s.mean, s.target, s.n_winners
        self.winner_agent_id, self.winner_value = s.winner_agent_id, s.winner_value


def check(result, expected: dict) -> None:
    assert result.n == expected["n"]
    assert result.n_valid == expected["n_valid"]
    assert result.winner_agent_id == expected["winner_agent_id"]
    assert result.winner_value == expected["winner_value"]
    assert result.n_winners == expected["n_winners"]
    if expected["mean"] is None:
        assert result.mean is None and result.target is None
    else:
        assert result.mean == pytest.approx(expected["mean"], rel=1e-12, abs=1e-12)
        assert result.target == pytest.approx(expected["target"], rel=1e-12, abs=1e-12)


GAMES = [("2/3", 0.0), ("1/2", 5.0), ("51/100", 0.0)]


# --- brute force vs. partials --------------------------------------------------------------
@pytest.mark.parametrize("ratio,offset", GAMES)
@pytest.mark.parametrize("how", ["one_host", "contiguous", "random", "one_per_agent"])
@pytest.mark.parametrize("seed", range(12))
def test_partials_match_brute_force(ratio, offset, how, seed):
    rng = random.Random(f"{seed}-{ratio}-{how}")
    guesses = random_guesses(rng, rng.randint(1, 300))
    game = GameConfig(ratio=ratio, offset=offset)
    parts = split(guesses, how, rng)
    check(Decided(parts, game), brute_force(guesses, ratio, offset))


@pytest.mark.parametrize("ratio,offset", GAMES)
def test_small_value_range_many_ties(ratio, offset):
    # Few distinct values, many agents per value: n_winners must count all agents on the
    # winning value, across hosts, and the winner must be the smallest id across hosts.
    rng = random.Random(7)
    for _ in range(30):
        guesses = [(a, float(rng.randint(0, 4) * 10)) for a in rng.sample(range(5000), 200)]
        parts = split(guesses, "random", rng)
        result = Decided(parts, GameConfig(ratio=ratio, offset=offset))
        check(result, brute_force(guesses, ratio, offset))
        assert result.n_winners > 1


def test_merge_is_order_independent():
    rng = random.Random(42)
    guesses = random_guesses(rng, 500)
    partials = partials_of(split(guesses, "random", rng))
    ref = merge(partials)
    for _ in range(20):
        shuffled = partials[:]
        rng.shuffle(shuffled)
        assert merge(shuffled) == ref
    # the order in which agents are added to a builder does not matter either
    shuffled_guesses = guesses[:]
    rng.shuffle(shuffled_guesses)
    assert merge(partials_of([shuffled_guesses])) == ref


def test_merge_nests_like_group_envs():
    """Group partials (merges of host partials) merged again equal a flat merge."""
    rng = random.Random(5)
    guesses = random_guesses(rng, 400)
    partials = partials_of(split(guesses, "random", rng))
    groups = [merge(partials[i:i + 3]) for i in range(0, len(partials), 3)]
    assert merge(groups) == merge(partials)


def test_merge_of_nothing_is_empty():
    assert merge([]) == GuessPartial(n_valid=0, total=0.0, by_value=[])


# --- the builder itself -----------------------------------------------------------------
def test_partial_counts_and_min_agent():
    p = partial_of([(9, 10.0), (4, 10.0), (7, None), (2, 3.5), (6, 10.0), (1, None)])
    assert p.n_valid == 4
    assert p.total == 33.5
    assert p.by_value == [(3.5, 1, 2), (10.0, 3, 4)]  # sorted by value; smallest agent per value


# --- specific rounds ------------------------------------------------------------------------
def test_all_invalid_round():
    r = Decided([[(a, None) for a in range(5)]], GameConfig())
    assert (r.n, r.n_valid, r.n_winners) == (5, 0, 0)
    assert r.mean is None and r.target is None
    assert r.winner_agent_id is None and r.winner_value is None


def test_invalid_counted_in_n_not_in_mean():
    # valid: 10, 20, 60 -> mean 30, target 20 (2/3) -> winner value 20 (agent 2)
    guesses = [(0, None), (1, 10.0), (2, 20.0), (3, None), (4, 60.0)]
    r = Decided([guesses[:2], guesses[2:]], GameConfig(ratio="2/3"))
    assert r.n == 5 and r.n_valid == 3
    assert r.mean == 30.0
    assert r.target == pytest.approx(20.0)
    assert (r.winner_agent_id, r.winner_value, r.n_winners) == (2, 20.0, 1)


def test_offset_is_added():
    # mean 40, ratio 1/2, offset 5 -> target 25
    guesses = [(0, 20.0), (1, 26.0), (2, 74.0), (3, 40.0)]
    r = Decided([guesses], GameConfig(ratio="1/2", offset=5))
    assert r.mean == 40.0 and r.target == 25.0
    assert (r.winner_agent_id, r.winner_value) == (1, 26.0)


@pytest.mark.parametrize("ids,expected_winner", [((3, 7), (3, 9.0)), ((7, 3), (3, 11.0))])
def test_equidistant_tie_smallest_agent_wins(ids, expected_winner):
    # 9, 11 and 40: mean 20, ratio 1/2 -> target exactly 10; 9 and 11 are both 1 away.
    low_id, high_id = ids
    guesses = [(low_id, 9.0), (high_id, 11.0), (5, 40.0)]
    for parts in ([guesses], [[guesses[0]], [guesses[1], guesses[2]]], [[g] for g in reversed(guesses)]):
        r = Decided(parts, GameConfig(ratio="1/2"))
        assert r.target == 10.0
        assert r.n_winners == 2
        assert (r.winner_agent_id, r.winner_value) == expected_winner


def _reduced(by_value: dict[float, tuple[int, int]]) -> GuessPartial:
    n = sum(c for c, _ in by_value.values())
    return GuessPartial(n_valid=n, total=sum(v * c for v, (c, _) in by_value.items()),
                        by_value=[(v, c, a) for v, (c, a) in sorted(by_value.items())])


def test_near_tie_within_eps_counts_all_but_beyond_eps_does_not():
    game = GameConfig(ratio="1")  # target == mean == 10 (the offsets below cancel out)
    close = _reduced({10.0 - 2e-10: (1, 8), 10.0 + 3e-10: (1, 4), 10.0 - 1e-10: (1, 6)})
    r = decide_round(close, game)
    assert r.target == pytest.approx(10.0)
    assert r.n_winners == 3  # all three distances are within TIE_EPS of the best
    assert r.winner_agent_id == 4  # smallest id among the tied agents, not the closest value
    far = _reduced({10.0 - 1e-6: (1, 8), 10.0 + 3e-6: (1, 4), 10.0 - 2e-6: (1, 6)})
    r = decide_round(far, game)
    assert (r.n_winners, r.winner_agent_id, r.winner_value) == (1, 8, 10.0 - 1e-6)
    assert TIE_EPS == 1e-9


def test_target_function():
    assert target(30.0, GameConfig(ratio="2/3")) == pytest.approx(20.0)
    assert target(30.0, GameConfig(ratio="1/2", offset=5)) == 20.0
    assert target(100.0, GameConfig(ratio="51/100")) == pytest.approx(51.0)


@pytest.mark.parametrize(("ratio", "offset", "max_value", "expected"), [
    ("2/3", 0, 100, 0.0),
    ("51/100", 0, 100, 0.0),
    ("1/2", 5, 100, 10.0),          # 5 + ½·mean → 10
    ("0.5", 5, 100, 10.0),
    ("1/2", 60, 100, 100.0),  # fixed point 120, clipped to max
    ("2/3", -10, 100, 0.0),          # fixed point negative, clipped to 0
    ("3/2", 0, 100, 100.0),          # ratio > 1: everyone at the maximum
    ("3/2", -60, 100, None),         # ratio > 1 and max undershoots: no unique equilibrium
    ("1", 0, 100, None),             # every common value is an equilibrium
    ("1", 3, 100, 100.0),
])
def test_equilibrium(ratio, offset, max_value, expected):
    got = equilibrium(GameConfig(ratio=ratio, offset=offset, max_value=max_value))
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_describe_states_the_rule_as_written():
    assert describe(GameConfig(ratio="2/3")) == "target = 2/3 · mean; guesses in [0, 100]"
    assert describe(GameConfig(ratio="1/2", offset=5, max_value=50)) == "target = 1/2 · mean + 5; guesses in [0, 50]"
