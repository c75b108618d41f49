"""The recommender: a feed is the k best posts of the whole pool for that agent (checked against
scoring every post, over random pools, stances, follows and agents with many posts of their
own), with the score the README gives, ties to the newer post, and one shared object for the
agents a stance's ranking serves as it is."""

from __future__ import annotations

import math

import numpy as np
import pytest
from populace_feed.recommender import (
    EXTRA,
    Ranker,
    Timeline,
    Weights,
    base_scores,
    best_first,
    interest_table,
    rank_whole,
)

W = Weights(k=5, half_life=2.0, popularity=1.0, repost_weight=2.0, recency=1.0, similarity=1.0, follow_boost=1.0,
            scale=3)


def pool(n: int, agents: int, rounds: int, seed: int, weights: Weights = W, round_: int | None = None) -> Ranker:
    rng = np.random.default_rng(seed)
    posted = rng.integers(0, rounds + 1, n)
    ids = np.sort(rng.choice(10 * n + 10, n, replace=False))
    # few distinct likes and stances: many exactly equal scores, so the tie-break is exercised
    return Ranker(rounds + 1 if round_ is None else round_, ids, rng.integers(0, agents, n), posted,
                  rng.integers(-weights.scale, weights.scale + 1, n), rng.integers(0, 3, n), rng.integers(0, 2, n),
                  np.asarray([f"post {i}" for i in range(n)], dtype=object), weights,
                  interest_table(seed, agents, 8) if weights.interest else None)


# a boost of 0 ties followed posts with others; no similarity ties whole stances
VARIANTS = [W, Weights(k=5, half_life=2.0, popularity=1.0, repost_weight=2.0, recency=1.0, similarity=0.0,
                       follow_boost=0.0, scale=3),
            Weights(k=12, half_life=0.5, popularity=0.0, repost_weight=0.0, recency=1.0, similarity=3.0,
                    follow_boost=0.25, scale=3),
            # interest similarity on vectors: every reader ranked over the whole pool (the SDK's toolkit)
            Weights(k=5, half_life=2.0, popularity=1.0, repost_weight=2.0, recency=1.0, similarity=1.0,
                    follow_boost=1.0, scale=3, interest=2.0),
            Weights(k=8, half_life=2.0, popularity=0.0, repost_weight=0.0, recency=0.0, similarity=0.0,
                    follow_boost=0.0, scale=3, interest=1.0)]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_every_feed_is_the_best_k_of_the_whole_pool(seed, variant):
    rng = np.random.default_rng(100 + seed)
    agents = 40
    ranker = pool(n=int(rng.integers(1, 400)), agents=agents, rounds=5, seed=seed, weights=VARIANTS[variant])
    for agent in range(agents):
        stance = int(rng.integers(-3, 4))
        following = tuple(sorted(set(rng.integers(0, agents, int(rng.integers(0, 8))).tolist()) - {agent}))
        feed = ranker.feed(agent, stance, following)
        assert feed.post_ids == rank_whole(ranker, agent, stance, following), (agent, stance, following)
        assert agent not in feed.authors  # never its own posts
        assert feed.followed == tuple(a in following for a in feed.authors)
        assert len(feed) == min(ranker.w.k, int((ranker.authors != agent).sum()))


def test_an_agent_with_many_posts_of_its_own_is_ranked_over_the_whole_pool():
    # agent 0 wrote most of the pool: its stance's top list holds more than EXTRA of its posts
    n = 200
    authors = np.where(np.arange(n) < 150, 0, 1 + np.arange(n) % 7)
    ranker = Ranker(3, np.arange(n), authors, np.zeros(n, np.int64), np.zeros(n, np.int64),
                    np.where(np.arange(n) < 150, 50, 0), np.zeros(n, np.int64),
                    np.asarray(["x"] * n, dtype=object), W)
    assert sum(a == 0 for a in ranker.authors[best_first(ranker.scores(0), ranker.post_ids, W.k + EXTRA)]) > EXTRA
    feed = ranker.feed(0, 0)
    assert feed.post_ids == rank_whole(ranker, 0, 0) and set(feed.authors) - {0} == set(feed.authors)
    assert len(feed) == W.k


def test_the_score_is_the_documented_formula_and_ties_go_to_the_newer_post():
    w = Weights(k=3, half_life=2.0, popularity=1.5, repost_weight=2.0, recency=0.5, similarity=2.0, follow_boost=3.5,
                scale=2)
    # posts: id, author, posted in, stance, likes, reposts
    rows = [(10, 1, 4, 2, 3, 1), (11, 2, 3, -2, 0, 0), (12, 3, 4, 0, 0, 0), (13, 4, 4, 0, 0, 0)]
    ids, authors, rounds, stances, likes, reposts = (np.asarray(c) for c in zip(*rows))
    ranker = Ranker(5, ids, authors, rounds, stances, likes, reposts, np.asarray(["a", "b", "c", "d"], dtype=object), w)

    def score(i: int, stance: int, follows: bool) -> float:
        _, _, r, s, lk, rp = rows[i]
        return ((1.5 * math.log1p(lk + 2 * rp) + 0.5) * 2 ** (-(5 - r) / 2.0)
                + 2.0 * (1 - abs(stance - s) / 4) + 3.5 * follows)

    assert np.allclose(ranker.scores(1), [score(i, 1, False) for i in range(4)])
    assert np.allclose(base_scores(likes, reposts, rounds, 5, w), [score(i, 0, False) - 2.0 * (1 - abs(rows[i][3]) / 4)
                                                                   for i in range(4)])
    feed = ranker.feed(9, 1)
    assert feed.post_ids == (10, 13, 12)  # 12 and 13 score the same: the newer (13) first
    assert feed == Timeline(5, 1, (10, 13, 12), (1, 4, 3), (2, 0, 0), (3, 0, 0), (1, 0, 0), ("a", "d", "c"),
                            (False, False, False))
    # following author 2 lifts its post (against the agent's stance) into the feed, marked
    followed = ranker.feed(9, 1, following=(2,))
    assert followed.post_ids == (11, 10, 13) and followed.followed == (True, False, False)
    assert score(1, 1, True) > score(0, 1, False)
    # its own post never shows
    assert ranker.feed(1, 1).post_ids == (13, 12, 11)


def test_agents_without_follows_or_own_posts_in_view_share_their_stance_feed():
    ranker = pool(n=300, agents=1000, rounds=3, seed=4)
    top_authors = set(ranker.authors[best_first(ranker.scores(2), ranker.post_ids, W.k + EXTRA)].tolist())
    outsiders = [a for a in range(1000) if a not in top_authors][:3]
    feeds = [ranker.feed(a, 2) for a in outsiders]
    assert feeds[0] is feeds[1] is feeds[2]
    assert ranker.feed(outsiders[0], 2, following=(999_999,)) is feeds[0]  # an author with no post in the pool
    assert ranker.feed(outsiders[0], -2) is not feeds[0]


def test_an_empty_pool_and_a_pool_smaller_than_k():
    empty = Ranker(1, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                   np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, dtype=object), W)
    assert empty.feed(0, 0, (1, 2)) == Timeline(1, 0)
    small = pool(n=3, agents=2, rounds=1, seed=1)
    for agent in (0, 1, 5):
        assert small.feed(agent, 1, (0, 1)).post_ids == rank_whole(small, agent, 1, (0, 1))


def test_best_first_keeps_every_tie_at_the_cut_in_id_order():
    scores = np.asarray([1.0, 2.0, 2.0, 2.0, 0.5])
    ids = np.asarray([5, 1, 9, 3, 7])
    assert best_first(scores, ids, 2).tolist() == [2, 3]  # ids 9 and 3 of the three tied at 2.0
    assert best_first(scores, ids, 10).tolist() == [2, 3, 1, 0, 4]
    assert best_first(scores, ids, 0).tolist() == []
