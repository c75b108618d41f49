"""The rules, pure: what is on the table, when a conversation makes a deal and who gets what,
and exact integer partials that give the same round however the pairs are split."""

from __future__ import annotations

import itertools
import random

import pytest
from populace_bargaining.rules import Agreement, Counts, Line, agreement, merge, on_table, shares, summary

A, B = 7, 3
BAD = None


def line(speaker, propose=5, accept=False, say="x"):
    if propose is BAD:
        return Line(speaker, None, None, None)
    return Line(speaker, say, propose, accept)


def test_the_other_s_latest_valid_proposal_is_on_the_table():
    lines = [line(A, 5), line(B, 2), line(A, 4)]
    assert on_table(lines, B) == lines[2] and on_table(lines, A) == lines[1]
    assert on_table(lines[:1], A) is None  # one's own proposal is never on one's table
    assert on_table([], A) is None
    assert on_table([line(A, 5), line(B, 2), line(A, BAD)], B) == lines[0]  # an invalid message leaves the earlier one


def test_an_accept_of_the_proposal_on_the_table_makes_the_deal():
    lines = [line(A, 3), line(B, 6), line(A, 4, accept=True), line(B, 9, accept=True)]
    assert agreement(lines) == Agreement(turn=3, proposer=B, acceptor=A, given=6)
    assert agreement(lines[:2]) is None


def test_an_accept_with_nothing_on_the_table_does_nothing():
    assert agreement([line(A, 3, accept=True)]) is None
    assert agreement([line(A, BAD), line(B, 5, accept=True)]) is None  # A never proposed validly
    assert agreement([line(A, BAD), line(B, 5, accept=True), line(A, 2, accept=True)]) == Agreement(3, B, A, 5)


def test_an_accept_after_an_invalid_message_takes_the_others_earlier_proposal():
    lines = [line(A, 3), line(B, 6), line(A, BAD), line(B, 1, accept=True)]
    assert agreement(lines) == Agreement(turn=4, proposer=A, acceptor=B, given=3)


def test_shares_are_the_accepted_split_or_nothing():
    deal = Agreement(turn=2, proposer=A, acceptor=B, given=3)
    assert (shares(10, deal, A), shares(10, deal, B)) == (7, 3)
    assert (shares(10, None, A), shares(10, None, B)) == (0, 0)
    assert shares(10, Agreement(2, A, B, 10), A) == 0 and shares(10, Agreement(2, A, B, 0), A) == 10


def random_counts(rng: random.Random) -> Counts:
    pairs = rng.randint(0, 50)
    deals = rng.randint(0, pairs)
    return Counts(pairs=pairs, deals=deals, messages=rng.randint(2 * pairs, 6 * pairs),
                  deal_messages=rng.randint(2 * deals, 6 * deals), first_coins=rng.randint(0, 10 * deals),
                  unmatched=rng.randint(0, 1))


@pytest.mark.parametrize("seed", range(5))
def test_merge_is_associative_and_commutative(seed):
    rng = random.Random(seed)
    a, b, c = (random_counts(rng) for _ in range(3))
    expected = merge([a, b, c])
    assert merge([merge([a, b]), c]) == expected == merge([a, merge([b, c])])
    for order in itertools.permutations([a, b, c]):
        assert merge(order) == expected
    assert merge([]) == Counts()


def test_summary_means_and_rates():
    s = summary(Counts(pairs=4, deals=3, messages=17, deal_messages=11, first_coins=14, unmatched=1), 10)
    assert (s.pairs, s.deals, s.unmatched) == (4, 3, 1)
    assert s.deal_rate == 0.75 and s.mean_turns == 17 / 4 and s.mean_turns_to_deal == 11 / 3
    assert s.mean_first_share == 14 / 3 and s.first_share_of_pie == 14 / 30


def test_a_round_without_deals_or_pairs_has_no_means():
    s = summary(Counts(pairs=2, messages=12), 10)
    assert s.deal_rate == 0.0 and s.mean_turns == 6.0
    assert s.mean_turns_to_deal is None and s.mean_first_share is None and s.first_share_of_pie is None
    empty = summary(Counts(), 10)
    assert empty.deal_rate is None and empty.mean_turns is None and empty.pairs == 0
