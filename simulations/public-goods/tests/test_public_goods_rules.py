"""The game's maths, pure: payoffs (invalid answers count as 0), exact integer partials that
give the same round however the agents are split, and the summary made from them."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest
from populace_public_goods import rules
from populace_public_goods.rules import GoodsPartial, equilibrium, merge, partial_of, settle_group

M = Fraction(8, 5)  # 1.6


def exact_payoffs(contributions, endowment, multiplier):
    """The formula, written out independently: E − c + m·G/k with None counted as 0."""
    k = len(contributions)
    pot = sum(c or 0 for c in contributions)
    return [endowment - (c or 0) + multiplier * pot / k for c in contributions]


def test_payoff_is_kept_tokens_plus_an_equal_share_of_the_multiplied_pot():
    total, payoffs = settle_group([10, 0, 20, 5, 5], 20, M)
    assert total == 40
    # share = 1.6 · 40 / 5 = 12.8
    assert payoffs == [22.8, 32.8, 12.8, 27.8, 27.8]


def test_an_invalid_answer_counts_as_zero_keeps_the_endowment_and_gets_its_share():
    total, payoffs = settle_group([10, None, 10], 20, Fraction(2))
    assert total == 20  # the invalid member put nothing in
    share = Fraction(2) * 20 / 3
    assert payoffs[1] == float(20 + share)  # its whole endowment plus the share
    assert payoffs[0] == payoffs[2] == float(10 + share)


def test_a_smaller_group_shares_among_its_actual_members():
    _, pair = settle_group([10, 0], 20, M)
    _, five = settle_group([10, 0, 0, 0, 0], 20, M)
    assert pair == [10 + 8.0, 20 + 8.0]  # 1.6 · 10 / 2
    assert five[:2] == [10 + 3.2, 20 + 3.2]  # 1.6 · 10 / 5


def test_a_lone_member_gets_its_whole_multiplied_contribution_back():
    assert settle_group([5], 10, M) == (5, [5 + 8.0])


@pytest.mark.parametrize("seed", range(5))
def test_payoffs_are_the_correctly_rounded_exact_values(seed):
    rng = random.Random(seed)
    endowment = rng.randint(1, 100)
    multiplier = Fraction(rng.randint(1, 400), rng.choice([1, 3, 7, 10, 100]))
    contributions = [rng.choice([None, *range(endowment + 1)]) for _ in range(rng.randint(1, 9))]
    _, payoffs = settle_group(contributions, endowment, multiplier)
    assert payoffs == [float(p) for p in exact_payoffs(contributions, endowment, multiplier)]


@pytest.mark.parametrize("seed", range(5))
def test_the_sum_of_payoffs_needs_only_integer_totals(seed):
    # Σ payoff = E·n + (m − 1)·Σ G, with invalid answers counted as 0
    rng = random.Random(seed)
    endowment, multiplier = 20, Fraction(rng.randint(1, 50), 10)
    groups = [[rng.choice([None, *range(21)]) for _ in range(rng.randint(1, 6))] for _ in range(rng.randint(1, 8))]
    exact = sum(sum(exact_payoffs(g, endowment, multiplier)) for g in groups)
    n = sum(len(g) for g in groups)
    pots = sum(settle_group(g, endowment, multiplier)[0] for g in groups)
    assert exact == endowment * n + (multiplier - 1) * pots
    assert rules.mean_payoff(n, pots, endowment, multiplier) == exact / n


def test_partial_counts_valid_answers_free_riders_full_contributors_and_groups():
    p = partial_of(range(7), [0, 20, 5, None, 0, 20, None], endowment=20, group_size=5)
    assert (p.n, p.n_valid, p.total, p.free_riders, p.full, p.groups) == (7, 5, 45, 2, 2, 2)


def test_a_group_cut_by_a_batch_boundary_is_counted_once():
    ids = list(range(12))  # groups of 5: 0-4, 5-9, 10-11
    values = [1] * 12
    for cut in range(1, 12):
        parts = [partial_of(ids[:cut], values[:cut], 20, 5), partial_of(ids[cut:], values[cut:], 20, 5)]
        assert merge(parts).groups == 3


def random_partial(rng: random.Random) -> GoodsPartial:
    n = rng.randint(0, 50)
    values = [rng.choice([None, *range(11)]) for _ in range(n)]
    first = rng.randint(0, 1000)
    return partial_of(range(first, first + n), values, endowment=10, group_size=4)


def fields(p: GoodsPartial) -> tuple:
    return (p.n, p.n_valid, p.total, p.free_riders, p.full, p.groups)


@pytest.mark.parametrize("seed", range(5))
def test_merge_is_associative_and_commutative(seed):
    rng = random.Random(seed)
    a, b, c = (random_partial(rng) for _ in range(3))
    expected = fields(merge([a, b, c]))
    assert fields(merge([merge([a, b]), c])) == expected
    assert fields(merge([a, merge([b, c])])) == expected
    for order in itertools.permutations([a, b, c]):
        assert fields(merge(order)) == expected
    assert fields(merge([])) == (0, 0, 0, 0, 0, 0)


@pytest.mark.parametrize("seed", range(5))
def test_any_split_of_the_agents_gives_the_same_summary(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 60)
    values = [rng.choice([None, *range(21)]) for _ in range(n)]
    whole = rules.decide_round(partial_of(range(n), values, 20, 5), 20, M)
    cuts = sorted(rng.sample(range(1, n), rng.randint(1, min(5, n - 1))))
    bounds = list(zip([0, *cuts], [*cuts, n]))
    rng.shuffle(bounds)
    parts = [partial_of(range(lo, hi), values[lo:hi], 20, 5) for lo, hi in bounds]
    assert rules.decide_round(merge(parts), 20, M) == whole


def test_summary_means_and_shares():
    p = partial_of(range(5), [0, 20, 10, None, 0], endowment=20, group_size=5)
    s = rules.decide_round(p, 20, M)
    assert s.mean_contribution == 7.5  # over the 4 valid answers
    assert s.mean_payoff == float(Fraction(20 * 5) / 5 + Fraction(3, 5) * 30 / 5)  # over all 5 agents
    assert (s.total_contribution, s.groups) == (30, 1)
    assert (s.free_riders, s.full_contributors) == (0.5, 0.25)


def test_a_round_of_invalid_answers_has_no_mean_contribution_but_a_mean_payoff():
    s = rules.decide_round(partial_of(range(3), [None] * 3, 20, 5), 20, M)
    assert s.mean_contribution is None and s.free_riders is None and s.full_contributors is None
    assert s.mean_payoff == 20.0  # everyone kept the endowment; the pot was empty
    empty = rules.decide_round(GoodsPartial(), 20, M)
    assert empty.mean_payoff is None and empty.total_contribution == 0


def test_group_news_average_is_the_pot_over_the_actual_size():
    assert rules.GroupNews(round=2, total=7, size=2).average == 3.5


@pytest.mark.parametrize(("multiplier", "group_size", "expected"), [
    (Fraction(8, 5), 5, 0.0),  # a token given returns 1.6/5 < 1 to its giver: free ride
    (Fraction(1, 2), 5, 0.0),
    (Fraction(6), 5, 20.0),  # returns more than it costs: give everything
    (Fraction(5), 5, None),  # indifferent: no unique prediction
])
def test_equilibrium(multiplier, group_size, expected):
    assert equilibrium(20, multiplier, group_size) == expected
