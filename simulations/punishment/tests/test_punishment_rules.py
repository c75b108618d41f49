"""The game's arithmetic, pure: payoffs (invalid answers count as 0, points within their bounds),
which points are antisocial, exact integer partials that merge to the same round however the
agents are split, and the summary made from them."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from populace_punishment import rules
from populace_punishment.parsing import parse_contribution, parse_points
from populace_punishment.rules import Counts, Punish, Terms, merge, others, settle_group, summary

TERMS = Terms(endowment=20, multiplier=Fraction(8, 5), cost=1, fine=3)  # Fehr & Gächter's prices, m = 1.6


def by_hand(terms: Terms, contributions, points):
    """The formula written out independently, with Fractions: E − c + m·G/k − cost·given − fine·received."""
    k = len(contributions)
    c = [x or 0 for x in contributions]
    pot = sum(c)
    given = [sum(row) if row else 0 for row in points]
    received = [0] * k
    for i, row in enumerate(points):
        for j, p in zip([j for j in range(k) if j != i], row or ()):
            received[j] += p
    return [terms.endowment - c[i] + terms.multiplier * pot / k - terms.cost * given[i] - terms.fine * received[i]
            for i in range(k)]


def test_payoff_is_kept_tokens_plus_the_share_minus_what_punishing_and_being_punished_cost():
    # contributions 20, 10, 0, 10: pot 40, share 1.6 · 40 / 4 = 16
    # member 0 gives C (the free rider) 4 points; member 1 gives C 2 and A 1; C gives A 3
    s = settle_group(TERMS, [20, 10, 0, 10], [[0, 4, 0], [1, 2, 0], [3, 0, 0], None])
    assert s.total == 40
    assert s.given == [4, 3, 3, 0] and s.received == [4, 0, 6, 0]
    assert s.payoffs == [20 - 20 + 16 - 4 - 12, 20 - 10 + 16 - 3, 20 - 0 + 16 - 3 - 18, 20 - 10 + 16]
    # antisocial: points to members who gave as much as the punisher or more (1 gave A, who gave
    # 20 ≥ 10, one point; C punished A, 20 ≥ 0, 3 points); 0's points to C (0 < 20) are not
    assert s.antisocial == [0, 1, 3, 0]


def test_an_invalid_contribution_counts_as_zero_and_an_invalid_punishment_as_no_points():
    s = settle_group(TERMS, [None, 10, 10, 10], [None, [5, 0, 0], None, None])
    assert s.total == 30 and s.given == [0, 5, 0, 0] and s.received == [5, 0, 0, 0]
    share = TERMS.multiplier * 30 / 4  # 12
    assert s.payoffs == [float(20 + share - 15), float(10 + share - 5), float(10 + share), float(10 + share)]
    # the invalid member counts as having given 0: punishing it is not antisocial (0 < 10)
    assert s.antisocial == [0, 0, 0, 0]


def test_points_to_each_other_member_follow_the_groups_order_without_the_punisher():
    assert others(0, 4) == [1, 2, 3] and others(2, 4) == [0, 1, 3] and others(0, 1) == []
    view = Punish(seat=1, members=(40, 41, 42), contributions=(5, None, 7))
    assert view.targets == [40, 42] and view.total == 12


def test_a_smaller_group_shares_among_its_members_and_a_lone_member_gets_its_pot_back():
    pair = settle_group(TERMS, [10, 0], [[0], [2]])
    assert pair.payoffs == [20 - 10 + 8 - 6, 20 + 8 - 2]  # 1.6 · 10 / 2 = 8
    alone = settle_group(TERMS, [5], [None])
    assert alone == (5, [0], [0], [0], [20 - 5 + 8.0])


@pytest.mark.parametrize("seed", range(8))
def test_payoffs_are_the_correctly_rounded_exact_values(seed):
    rng = random.Random(seed)
    terms = Terms(rng.randint(1, 100), Fraction(rng.randint(1, 400), rng.choice([1, 3, 7, 10, 100])),
                  rng.randint(0, 5), rng.randint(0, 5))
    k = rng.randint(1, 7)
    contributions = [rng.choice([None, *range(terms.endowment + 1)]) for _ in range(k)]
    points = [rng.choice([None, [rng.randint(0, 10) for _ in range(k - 1)]]) for _ in range(k)]
    s = settle_group(terms, contributions, points)
    assert s.payoffs == [float(p) for p in by_hand(terms, contributions, points)]
    # what a member's memory keeps is enough to say its payoff again
    for i in range(k):
        assert rules.payoff(terms, contributions[i], s.total, k, s.given[i], s.received[i]) == s.payoffs[i]


def counts_of(terms: Terms, groups) -> Counts:
    """One partial per member, as a host's reduce would count it (see PunishmentEnv.reduce)."""
    parts = []
    for contributions, points in groups:
        s = settle_group(terms, contributions, points)
        for i, c in enumerate(contributions):
            asked = len(contributions) > 1
            parts.append(Counts(n=1, n_valid=c is not None, total=c or 0, free_riders=c == 0,
                                punish_answers=asked and points[i] is not None,
                                punishers=asked and points[i] is not None and s.given[i] > 0,
                                points=s.given[i], antisocial=s.antisocial[i]))
    return parts


def random_groups(rng: random.Random, terms: Terms, n_groups: int):
    groups = []
    for _ in range(n_groups):
        k = rng.randint(1, 5)
        contributions = [rng.choice([None, *range(terms.endowment + 1)]) for _ in range(k)]
        points = [None if k == 1 or rng.random() < 0.2 else [rng.choice([0, 0, rng.randint(0, 10)])
                                                               for _ in range(k - 1)] for _ in range(k)]
        groups.append((contributions, points))
    return groups


@pytest.mark.parametrize("seed", range(6))
def test_partials_merge_to_the_same_round_however_they_are_split_and_the_mean_payoff_is_exact(seed):
    rng = random.Random(seed)
    terms = Terms(20, Fraction(rng.randint(1, 50), 10), rng.randint(0, 3), rng.randint(0, 4))
    groups = random_groups(rng, terms, 12)
    parts = counts_of(terms, groups)
    whole = merge(parts)
    for _ in range(5):  # any batches, hosts and order
        shuffled = parts[:]
        rng.shuffle(shuffled)
        cuts = sorted(rng.sample(range(1, len(shuffled)), 3))
        pieces = [merge(shuffled[a:b]) for a, b in zip([0, *cuts], [*cuts, len(shuffled)])]
        assert merge([merge(pieces[:2]), merge(pieces[2:])]) == whole
    assert merge([]) == Counts()
    exact = [p for contributions, points in groups for p in by_hand(terms, contributions, points)]
    assert rules.mean_payoff(whole, terms) == sum(exact) / len(exact)
    assert summary(whole, terms).mean_payoff == float(sum(exact) / len(exact))


def test_the_summary_is_made_from_the_counts():
    total = Counts(n=10, n_valid=8, total=60, free_riders=2, punish_answers=5, punishers=4, points=20, antisocial=5)
    s = summary(total, TERMS)
    assert s.mean_contribution == 7.5 and s.free_riders == 0.25
    assert s.punish_answers == 5 and s.share_punishing == 0.8 and s.mean_points == 4.0 and s.antisocial_share == 0.25
    # (20·10 + 0.6·60 − 4·20) / 10 = 15.6
    assert s.mean_payoff == 15.6
    empty = summary(Counts(), TERMS)
    assert (empty.mean_contribution, empty.mean_payoff, empty.share_punishing, empty.mean_points,
            empty.antisocial_share, empty.punish_answers) == (None, None, None, None, None, 0)


def test_the_selfish_prediction_is_the_public_goods_games():
    assert rules.equilibrium(20, Fraction(8, 5), 4) == 0.0
    assert rules.equilibrium(20, Fraction(5), 4) == 20.0
    assert rules.equilibrium(20, Fraction(4), 4) is None


@pytest.mark.parametrize(("raw", "value"), [
    ('{"contribution": 7}', 7), ('{"reasoning": "x", "contribution": 0}', 0), ('{"contribution": 20}', 20),
    ('{"contribution": 7.0}', 7), ('{"contribution": 21}', None), ('{"contribution": -1}', None),
    ('{"contribution": 7.5}', None), ('{"contribution": "7"}', None), ('{"contribution": true}', None),
    ('{"contribution": 1e999}', None), ('{"amount": 7}', None), ("7", None), ("I give 7.", None), ("", None),
    ("[" * 100_000, None),
])
def test_a_contribution_is_a_whole_number_of_tokens_within_the_endowment_or_nothing(raw, value):
    assert parse_contribution(raw, 20) == value


@pytest.mark.parametrize(("raw", "value"), [
    ('{"A": 0, "B": 3, "C": 10}', [0, 3, 10]), ('{"C": 1, "A": 2, "B": 0, "reasoning": "x"}', [2, 0, 1]),
    ('{"A": 0, "B": 3.0, "C": 0}', [0, 3, 0]),
    ('{"A": 0, "B": 11, "C": 0}', None),  # over the maximum: the whole answer is invalid, not capped
    ('{"A": 0, "B": -1, "C": 0}', None), ('{"A": 0, "B": 3}', None),  # a member left out
    ('{"A": 0, "B": "3", "C": 0}', None), ('{"A": 0, "B": false, "C": 0}', None),
    ('{"A": 0, "B": 0.5, "C": 0}', None), ('{"a": 0, "b": 0, "c": 0}', None), ("[0, 3, 0]", None),
    ("no points", None),
])
def test_points_are_whole_numbers_within_the_maximum_for_every_other_member_or_nothing(raw, value):
    assert parse_points(raw, "ABC", 10) == value
