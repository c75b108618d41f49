"""Counting is exact: any split into batches or hosts, merged in any order, gives the same
counts, and the round's summary follows from them."""

from __future__ import annotations

import random

import pytest
from populace_vote.tally import VoteCounts, count, merge, summarize

OPTIONS = ("yes", "no", "undecided")
INDEX = {o: i for i, o in enumerate(OPTIONS)}


def counts(*values: int) -> VoteCounts:
    return VoteCounts(counts=list(values))


def test_count_skips_invalid_answers_and_keeps_ballot_order():
    assert count(["no", None, "yes", "no", None], INDEX).counts == [1, 2, 0]
    assert count([], INDEX).counts == [0, 0, 0]


def test_merge_adds_per_option_and_of_nothing_is_zeros():
    assert merge([counts(1, 2, 0), counts(0, 5, 3)], 3).counts == [1, 7, 3]
    assert merge([], 3).counts == [0, 0, 0]


def test_merge_refuses_partials_of_another_ballot():
    with pytest.raises(ValueError, match="2 options, the ballot has 3"):
        merge([counts(1, 2, 0), counts(1, 1)], 3)


@pytest.mark.parametrize("seed", range(20))
def test_any_split_merged_in_any_order_and_grouping_gives_the_same_counts(seed):
    rng = random.Random(seed)
    choices = [rng.choice([*OPTIONS, None]) for _ in range(rng.randint(0, 200))]
    whole = count(choices, INDEX)
    cuts = sorted(rng.sample(range(len(choices) + 1), k=min(4, len(choices) + 1)))
    parts = [count(choices[a:b], INDEX) for a, b in zip([0, *cuts], [*cuts, len(choices)])]
    rng.shuffle(parts)  # commutative
    assert merge(parts, 3) == whole
    k = rng.randint(0, len(parts))  # associative: hosts of batches, or groups of hosts
    assert merge([merge(parts[:k], 3), merge(parts[k:], 3)], 3) == whole
    assert sum(whole.counts) == sum(c is not None for c in choices)


def test_summary_names_the_leader_and_its_share_of_valid_answers():
    s = summarize(OPTIONS, counts(2, 5, 1))
    assert (s.leader, s.leader_share) == ("no", 5 / 8)
    assert s.counts == {"yes": 2, "no": 5, "undecided": 1}
    assert list(s.counts) == list(OPTIONS)  # the JSON column keeps the ballot's order


def test_a_tie_for_the_lead_has_no_leader_but_a_share():
    s = summarize(OPTIONS, counts(3, 3, 1))
    assert s.leader is None and s.leader_share == 3 / 7


def test_no_valid_answer_has_neither_leader_nor_share_but_zero_counts():
    s = summarize(OPTIONS, counts(0, 0, 0))
    assert (s.leader, s.leader_share) == (None, None)
    assert s.counts == {"yes": 0, "no": 0, "undecided": 0}
