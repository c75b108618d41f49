"""The environment's rules, on hand-made rounds: the start world (seeded), reduce and merge
(any order, any batching), decide (likes and reposts added by post id, new posts numbered in a
seeded order, the pool kept by score, each agent's last stance), the summary's measures, and
the world's Arrow bytes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from populace_feed import Action, Pool
from populace_feed.recommender import base_scores
from populace_feed.simulation import POST_SALT, FeedState, polarisation

from populace.core.contracts import RunConfig
from populace.sdk import resolve, select
from populace.sdk.edges import follow, unfollow
from populace.sdk.engine import DecideFailed, RoundDecider


def env_of(agents: int = 50, seed: int = 4, **params):
    resolved = resolve(RunConfig.model_validate({"simulation": "feed", "agents": agents, "seed": seed, **params}))
    return resolved.simulation.Env(resolved.instance())


def test_the_start_world_is_seeded_and_its_seed_posts_say_their_authors_stance():
    env = env_of(pool={"seed_posts": 40, "size": 100})
    world = env.start_world(env.start())
    assert world.sizes == {"agents": 50, "posts": 40} and env.start().next_post_id == 40
    assert world.post_id.tolist() == list(range(40)) and world.posted_in.tolist() == [0] * 40
    assert (world.stance == world.last_stance[world.author]).all()
    assert set(world.last_stance.tolist()) == set(range(-3, 4))
    assert world.text[0].endswith(": Cities should ban private cars from their centres.")
    assert world.likes.min() >= 0 and world.likes.max() > 0 and world.reposts.sum() == 0
    assert world == env_of(pool={"seed_posts": 40, "size": 100}).start_world(env.start())  # every host builds it
    assert world != env_of(seed=5, pool={"seed_posts": 40, "size": 100}).start_world(env.start())


def test_the_world_round_trips_through_its_bytes():
    env = env_of(pool={"seed_posts": 40, "size": 100})
    world = env.start_world(env.start())
    back = Pool.from_bytes(world.to_bytes())
    assert back == world and back.text.tolist() == world.text.tolist() and back.digest == world.digest


def outcomes() -> tuple[list[int], list[Action]]:
    ids = [3, 5, 8, 9, 12]
    outs = [Action(stance=2, text="a", liked=4, reposted=7, followed=1, raw="r", edits=[follow(1)]),
            Action(stance=-3, text=None, liked=4, raw="r", unfollowed=2, edits=[unfollow(2)]),
            Action(valid=False, raw="nonsense"),
            Action(stance=0, text="b", reposted=7, raw="r"),
            Action(stance=3, text="c", liked=9, raw="r")]
    return ids, outs


def test_reduce_and_merge_fold_any_batching_in_any_order():
    env = env_of()
    ids, outs = outcomes()
    whole = env.merge([env.reduce(ids, outs)])
    parts = [env.reduce(ids[i:i + 2], outs[i:i + 2]) for i in range(0, 5, 2)]
    for order in ([0, 1, 2], [2, 0, 1]):
        merged = env.merge([env.merge([parts[order[0]]]), env.merge([parts[i] for i in order[1:]])])
        assert (merged.agents, merged.answered, merged.follows, merged.unfollows) == (5, 4, 1, 1)
        assert merged.stances.tolist() == whole.stances.tolist() == [1, 0, 0, 1, 0, 1, 1]
        assert (merged.liked.tolist(), merged.liked_n.tolist()) == ([4, 9], [2, 1])
        assert (merged.reposted.tolist(), merged.reposted_n.tolist()) == ([7], [2])
        assert sorted(zip(merged.voters.tolist(), merged.votes.tolist())) == [(3, 2), (5, -3), (9, 0), (12, 3)]
        assert sorted(zip(merged.post_authors.tolist(), merged.post_stances.tolist(), merged.post_texts)) == [
            (3, 2, "a"), (9, 0, "b"), (12, 3, "c")]
    empty = env.merge([])
    assert (empty.agents, empty.stances.tolist(), empty.post_texts) == (0, [0] * 7, [])


def test_decide_adds_engagement_numbers_new_posts_in_a_seeded_order_and_keeps_the_best():
    env = env_of(pool={"seed_posts": 10, "size": 12})
    state = env.start()
    world = env.start_world(state)
    ids, outs = outcomes()
    total = env.merge([env.reduce(ids, outs)])
    new_state, summary, after = env.decide(FeedState(next_post_id=10, net_follows=5), 1, total, world)
    # the new posts: ids 10, 11, 12 in the order of a seeded draw per (seed, round, author)
    draws = select.uniform(4, 1, np.asarray([3, 9, 12]), POST_SALT)
    in_order = [a for _, a in sorted(zip(draws.tolist(), [3, 9, 12]))]
    likes = world.likes.copy()
    likes[[4, 9]] += [2, 1]
    reposts = world.reposts.copy()
    reposts[7] += 2
    every = {i: (int(world.author[i]), 0, int(likes[i]), int(reposts[i])) for i in range(10)}
    every.update({10 + j: (a, 1, 0, 0) for j, a in enumerate(in_order)})
    post_ids = np.asarray(sorted(every))
    score = base_scores(np.asarray([every[i][2] for i in post_ids]), np.asarray([every[i][3] for i in post_ids]),
                        np.asarray([every[i][1] for i in post_ids]), 2, env.weights)
    kept = sorted(post_ids[np.lexsort((-post_ids, -score))][:12].tolist())
    assert after.post_id.tolist() == kept and after.sizes == {"agents": 50, "posts": 12}
    assert [(int(a), int(r), int(lk), int(rp)) for a, r, lk, rp in zip(after.author, after.posted_in, after.likes,
                                                                         after.reposts)] == [every[i] for i in kept]
    texts = dict(zip(after.post_id.tolist(), after.text.tolist()))
    assert {texts[10 + j] for j in range(3) if 10 + j in texts} <= {"a", "b", "c"}
    assert all(texts[10 + j] == {3: "a", 9: "b", 12: "c"}[a] for j, a in enumerate(in_order) if 10 + j in texts)
    last = world.last_stance.copy()
    last[[3, 5, 9, 12]] = [2, -3, 0, 3]
    assert after.last_stance.tolist() == last.tolist()  # agent 8 (invalid) keeps its stance
    assert new_state == FeedState(next_post_id=13, net_follows=5)
    assert (summary.posts, summary.likes, summary.reposts, summary.follows, summary.unfollows, summary.net_follows,
            summary.pool, summary.pool_new) == (3, 3, 2, 1, 1, 5, 12, sum(k >= 10 for k in kept))
    assert summary.active_share == 5 / 50
    assert world.post_id.tolist() == list(range(10))  # the round's world is never edited


def test_a_like_of_a_post_outside_the_pool_fails_the_round_naming_it():
    resolved = resolve(RunConfig.model_validate({"simulation": "feed", "agents": 20, "pool": {"seed_posts": 5}}))
    decider = RoundDecider(resolved)
    world = decider.opening().world
    env = decider.env
    with pytest.raises(DecideFailed, match=r"liked: post 99 is not in round 1's pool"):
        decider.decide(1, None, [env.reduce([0], [Action(stance=0, liked=99, raw="")])], world)


@pytest.mark.parametrize(("hist", "expected"), [
    ([0, 0, 0, 4, 0, 0, 0], (0.0, 0.0, 0.0, 0.0)),
    ([1, 0, 0, 0, 0, 0, 1], (0.0, 1.0, 1.0, 1.0)),  # half at -1, half at +1
    ([0, 0, 0, 0, 0, 0, 3], (1.0, 0.0, 1.0, 0.0)),  # one camp: no polarisation
    ([0, 1, 0, 1, 0, 2, 0], (1 / 6, None, 0.0, 2 * 0.5 * 0.25 * (2 / 3 + 2 / 3))),
])
def test_polarisation_of_a_stance_histogram(hist, expected):
    got = polarisation(np.asarray(hist), 3)
    mean, var, extreme, polar = expected
    assert math.isclose(got["mean_stance"], mean, abs_tol=1e-12)
    if var is not None:
        assert math.isclose(got["var_stance"], var, abs_tol=1e-12)
    assert math.isclose(got["extreme_share"], extreme, abs_tol=1e-12)
    assert math.isclose(got["polarization"], polar, abs_tol=1e-12)
    assert polarisation(np.zeros(7, np.int64), 3) == {"mean_stance": None, "var_stance": None,
                                                      "extreme_share": None, "polarization": None}


def test_activation_is_each_personas_rate():
    env = env_of()
    sel = env.select(env.start(), 1)
    assert sel == select.rate_by("activity", {"high": 0.5, "medium": 0.2, "low": 0.05}, default=0.1)
