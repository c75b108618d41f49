"""The recommender toolkit (populace.sdk.recommend): each part's formula, seeded draws the same on
every call, interest similarity exact (one reader or a matrix of them give the very same floats),
and a Ranker's feed equal to sorting every item's score by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from populace.sdk import recommend as rec
from populace.sdk.recommend import Mix, Ranker, RecommendError


def test_top_k_is_best_first_ties_to_the_higher_id_and_never_an_excluded_item():
    scores = np.array([1.0, 3.0, 3.0, -np.inf, 2.0, 3.0])
    ids = np.array([5, 1, 9, 7, 3, 2])
    assert rec.top_k(scores, ids, 3).tolist() == [2, 5, 1]  # the three 3.0s: ids 9, 2, 1
    assert rec.top_k(scores, ids, 10).tolist() == [2, 5, 1, 4, 0]  # -inf never comes back
    assert rec.top_k(np.full(3, -np.inf), ids[:3], 2).tolist() == []
    assert rec.top_k(scores, ids, 0).tolist() == []
    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(1, 300))
        s = rng.integers(0, 5, n).astype(np.float64)  # many ties
        i = rng.permutation(10 * n)[:n]
        k = int(rng.integers(1, 20))
        by_hand = sorted(range(n), key=lambda j: (-s[j], -i[j]))[:k]
        assert rec.top_k(s, i, k).tolist() == by_hand


def test_the_scores_are_the_documented_formulas():
    assert rec.recency(np.array([5, 3, 1]), 5, 2.0).tolist() == [1.0, 0.5, 0.25]
    # sign(s)·log10(max(|s|, 1)) + posted_in / period
    got = rec.hot(np.array([100, 0, 3]), np.array([2, 4, 1]), period=2.0, dislikes=np.array([0, 0, 13]))
    assert got.tolist() == [2.0 + 1.0, 0.0 + 2.0, -1.0 + 0.5]
    with pytest.raises(RecommendError, match="half_life"):
        rec.recency(np.array([1]), 2, 0.0)
    u = rec.random_scores(7, 3, 11, np.arange(1000))
    assert ((u >= 0) & (u < 1)).all() and abs(u.mean() - 0.5) < 0.05
    assert (u == rec.random_scores(7, 3, 11, np.arange(1000))).all()  # the same on every call and host
    assert (u != rec.random_scores(7, 3, 12, np.arange(1000))).mean() > 0.99  # another reader: other draws
    assert (u != rec.random_scores(7, 4, 11, np.arange(1000))).mean() > 0.99  # another round too


@pytest.mark.parametrize("dims", [3, 16, rec.EXACT_F32_DIMS + 5])  # float32, and float64 past its exact range
def test_similarity_is_exact_for_one_reader_or_many(dims):
    rng = np.random.default_rng(dims)
    items = rng.integers(-127, 128, (200, dims)).astype(np.int8)
    items[7] = 0  # a zero vector: similarity 0
    readers = rng.integers(-127, 128, (30, dims)).astype(np.int8)
    readers[4] = 0
    rows = rec.similarity_rows(readers, items)
    for r in range(30):
        assert (rec.similarity(readers[r], items) == rows[r]).all()  # bit for bit
    assert (rows[4] == 0).all() and (rows[:, 7] == 0).all()
    a, b = readers[0].astype(int).tolist(), items[0].astype(int).tolist()
    by_hand = sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    assert rows[0, 0] == pytest.approx(by_hand, rel=1e-12)
    with pytest.raises(RecommendError, match="int8 values"):
        rec.similarity(np.array([1.5] * dims), items)
    with pytest.raises(RecommendError, match="dimensions"):
        rec.similarity(readers[0][:-1], items)


def test_quantized_and_seeded_vectors():
    v = np.array([[0.2, -0.4, 0.1], [0.0, 0.0, 0.0]])
    q = rec.quantize(v)
    assert q.dtype == np.int8 and q.tolist() == [[64, -127, 32], [0, 0, 0]]
    assert rec.similarity(q[0], rec.quantize(v[:1] * 3))[0] == pytest.approx(1.0)  # the direction is kept
    table = rec.interests(5, np.arange(300_000), 4)  # drawn in chunks: the same as one at a time
    assert table.dtype == np.int8 and table.shape == (300_000, 4) and table.min() >= -127 and table.max() <= 127
    assert (rec.interests(5, [299_999, 3], 4) == table[[299_999, 3]]).all()
    assert (rec.interests(6, [3], 4) != table[3]).any()


def _items(n: int, seed: int):
    rng = np.random.default_rng(seed)
    return {"ids": rng.permutation(5 * n)[:n], "authors": rng.integers(0, 30, n),
            "posted_in": rng.integers(0, 6, n), "likes": rng.integers(0, 4, n), "dislikes": rng.integers(0, 2, n),
            "vectors": rng.integers(-127, 128, (n, 8)).astype(np.int8)}


@pytest.mark.parametrize("mix", [Mix.of("random"), Mix.of("recency"), Mix.of("hot"), Mix.of("interest"),
                                 Mix(random=0.3, recency=1.0, hot=0.5, interest=2.0, follow=1.5, half_life=3.0),
                                 Mix(recency=1.0, follow=0.0)])
def test_a_rankers_feed_is_the_best_k_of_every_item_scored_by_hand(mix):
    items = _items(400, 1)
    base = np.random.default_rng(2).random(400)
    ranker = Ranker(items["ids"], round=6, mix=mix, seed=9, base=base, **{k: v for k, v in items.items() if k != "ids"})
    rng = np.random.default_rng(4)
    for reader in range(30):
        vector = rng.integers(-127, 128, 8).astype(np.int8)
        following = sorted(set(rng.integers(0, 30, 4).tolist()) - {reader})
        extra = rng.random(400)
        s = (base + mix.recency * rec.recency(items["posted_in"], 6, mix.half_life)
             + mix.hot * rec.hot(items["likes"], items["posted_in"], mix.period, items["dislikes"]))
        s = s + extra + mix.random * rec.random_scores(9, 6, reader, items["ids"])
        s = s + mix.interest * rec.similarity(vector, items["vectors"])
        s = s + mix.follow * np.isin(items["authors"], following)
        mine = items["authors"] == reader
        by_hand = sorted(np.flatnonzero(~mine).tolist(), key=lambda j: (-s[j], -items["ids"][j]))[:10]
        got = ranker.top(reader, 10, vector=vector, following=following, extra=extra)
        assert got.tolist() == by_hand
        assert ranker.top(reader, 500, vector=vector, following=following, extra=extra, own=True).size == 400


@pytest.mark.parametrize("spread", [0.0, 0.5, 3.0, 50.0])  # items' own parts from all equal to far apart
@pytest.mark.parametrize("mix", [Mix(hot=1.0, interest=1.0, follow=1.0), Mix(recency=1.0, random=0.7, follow=0.2),
                                 Mix(interest=3.0), Mix(hot=1.0, follow=5.0)])
def test_scoring_only_the_items_that_can_make_the_top_k_gives_the_same_feed(spread, mix):
    rng = np.random.default_rng(int(spread * 10) + int(mix.follow * 7))
    n = 3000
    items = _items(n, 5)
    items["authors"] = rng.integers(0, 60, n)  # authors with many items each: own items fill the head
    base = np.round(rng.standard_normal(n) * spread, 1)  # rounded: many equal own parts
    base[rng.integers(0, n, 20)] = -np.inf  # left out whatever the reader
    ranker = Ranker(items["ids"], round=4, mix=mix, seed=2, base=base,
                    **{k: v for k, v in items.items() if k != "ids"})
    for reader in range(40):
        vector = rng.integers(-127, 128, 8).astype(np.int8)
        following = rng.integers(0, 60, int(rng.integers(0, 12))).tolist()
        for k in (1, 10, 50):
            s = ranker.scores(reader, vector=vector, following=following).copy()
            s[items["authors"] == reader] = -np.inf
            assert ranker.top(reader, k, vector=vector, following=following).tolist() == \
                rec.top_k(s, items["ids"], k).tolist(), (reader, k)
        everything = ranker.scores(reader, vector=vector, following=following)
        assert ranker.top(reader, 7, vector=vector, following=following, own=True).tolist() == \
            rec.top_k(everything, items["ids"], 7).tolist()


def test_a_mix_names_what_it_needs():
    with pytest.raises(RecommendError, match=r"likes: the mix weighs hot, which needs it"):
        Ranker([1, 2], round=1, mix=Mix.of("hot"), posted_in=[0, 1])
    with pytest.raises(RecommendError, match=r"vector: the mix weighs interest"):
        Ranker([1], round=1, mix=Mix.of("interest"), vectors=np.zeros((1, 2), np.int8)).top(0, 1)
    with pytest.raises(RecommendError, match=r"posted_in: 1 values for 2 items"):
        Ranker([1, 2], round=1, mix=Mix.of("recency"), posted_in=[0])
    with pytest.raises(RecommendError, match=r"mix\.follow: -1 must be a finite number >= 0"):
        Mix(follow=-1)
    with pytest.raises(RecommendError, match=r"recommender 'trending': one of random, recency, hot, interest"):
        Mix.of("trending")
