"""The rules, pure: who gets what, what counts as an answer (never guessed), and exact integer
partials that give the same round however the pairs are split between hosts."""

from __future__ import annotations

import itertools
import random

import pytest
from populace_ultimatum.rules import Counts, coins, merge, parse, payoffs, summary


def test_an_accepted_offer_goes_to_the_responder_and_the_proposer_keeps_the_rest():
    assert payoffs(10, 4, True) == (6, 4)
    assert payoffs(10, 0, True) == (10, 0) and payoffs(10, 10, True) == (0, 10)
    assert payoffs(1_000_000, 1, True) == (999_999, 1)


def test_a_rejected_or_invalid_offer_or_reply_leaves_both_with_nothing():
    assert payoffs(10, 4, False) == (0, 0)
    assert payoffs(10, 4, None) == (0, 0)  # no valid reply
    assert payoffs(10, None, None) == (0, 0)  # no valid offer (no reply asked)


@pytest.mark.parametrize(("text", "offer"), [
    ('{"offer": 4}', 4),
    ('  {"offer": 0} ', 0),
    ('{"reasoning": "half is fair", "offer": 5}', 5),
    ('{"offer": 4.0}', 4),  # a whole number written as a float
    ('{"offer": 7, "mood": "calm"}', 7),
    ('{"offer": 11}', 11),  # a whole number; its range is the agent's to check
    ('{"offer": -1}', -1),
    ('{"offer": 4.5}', None),  # never rounded
    ('{"offer": 1e999}', None),  # infinity
    ('{"offer": NaN}', None),
    ('{"offer": Infinity}', None),
    ('{"offer": true}', None),  # JSON true is not 1 coin
    ('{"offer": "4"}', None),
    ('{"offer": null}', None),
    ('{"amount": 4}', None),
    ('{"offer": 4', None),  # cut off
    ("[4]", None),
    ("4", None),
    ("I offer 4 coins.", None),
    ("", None),
    ("[" * 100_000, None),  # nested past the decoder's depth
])
def test_an_offer_is_a_whole_number_or_nothing(text, offer):
    assert parse(text, "offer", int) == offer


@pytest.mark.parametrize(("text", "accept"), [
    ('{"accept": true}', True),
    ('{"accept": false}', False),
    ('{"reasoning": "too little", "accept": false}', False),
    ('{"accept": "yes"}', None),
    ('{"accept": 1}', None),
    ('{"accept": null}', None),
    ('{"accepted": true}', None),
    ("true", None),
    ("I accept.", None),
    ("{" * 100_000, None),
])
def test_a_reply_is_true_or_false_or_nothing(text, accept):
    assert parse(text, "accept", bool) is accept


@pytest.mark.parametrize(("value", "whole"), [
    (0, 0), (4, 4), (10, 10), (4.0, 4), (11, None), (-1, None), (4.5, None), (True, None), (False, None),
    ("4", None), (None, None), (float("inf"), None), (float("nan"), None),
])
def test_coins_are_a_whole_number_within_the_pie(value, whole):
    assert coins(value, 10) == whole


def random_counts(rng: random.Random) -> Counts:
    pairs = rng.randint(0, 50)
    offers = rng.randint(0, pairs)
    replies = rng.randint(0, offers)
    accepted = rng.randint(0, replies)
    return Counts(pairs=pairs, offers=offers, offered=rng.randint(0, 10 * offers), replies=replies,
                  accepted=accepted, accepted_offered=rng.randint(0, 10 * accepted))


@pytest.mark.parametrize("seed", range(5))
def test_merge_is_associative_and_commutative(seed):
    rng = random.Random(seed)
    a, b, c = (random_counts(rng) for _ in range(3))
    expected = merge([a, b, c])
    assert merge([merge([a, b]), c]) == expected == merge([a, merge([b, c])])
    for order in itertools.permutations([a, b, c]):
        assert merge(order) == expected
    assert merge([]) == Counts() and merge([a]) == a
    assert expected.pairs == a.pairs + b.pairs + c.pairs
    assert expected.accepted_offered == a.accepted_offered + b.accepted_offered + c.accepted_offered


def test_summary_means_and_rates():
    s = summary(Counts(pairs=5, offers=4, offered=18, replies=3, accepted=2, accepted_offered=11), 10)
    assert s.pairs == 5
    assert s.mean_offer == 18 / 4 and s.offer_share == 18 / 40
    assert s.acceptance_rate == 2 / 3 and s.mean_accepted_offer == 11 / 2


def test_a_round_without_offers_replies_or_pairs_has_no_means():
    s = summary(Counts(pairs=2), 10)
    assert s.pairs == 2
    assert s.mean_offer is None and s.offer_share is None
    assert s.acceptance_rate is None and s.mean_accepted_offer is None
    s = summary(Counts(pairs=2, offers=2, offered=6, replies=2), 10)
    assert s.acceptance_rate == 0.0 and s.mean_accepted_offer is None  # replied, all rejected
    assert summary(Counts(), 10).pairs == 0
