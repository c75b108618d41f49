"""The scenario's `pool:`, `recommender:`, `stance:`, `activity:` and `prompt:` sections:
validated by the simulation, every error naming the field as the scenario wrote it; the
declaration the platform records from."""

from __future__ import annotations

import pytest
from populace_feed import Microblog
from populace_feed.params import FeedParams
from pydantic import ValidationError

from populace.core.contracts import RunConfig
from populace.core.scenario import format_validation_error
from populace.sdk import resolve


def error_of(**scenario) -> str:
    config = RunConfig.model_validate({"simulation": "feed", "agents": 20, **scenario})
    with pytest.raises(ValidationError) as info:
        resolve(config)
    return format_validation_error(info.value)


def test_defaults_resolve():
    r = resolve(RunConfig(simulation="feed", agents=12))
    assert r.simulation is Microblog
    p = r.params
    assert (p.pool.size, p.pool.seed_posts) == (10_000, 1_000)
    rec = p.recommender
    assert (rec.k, rec.half_life, rec.popularity, rec.repost_weight, rec.recency, rec.similarity,
            rec.follow_boost, rec.interest, rec.interest_dims, rec.record_shown) == (10, 2.0, 1.0, 2.0, 1.0, 1.0, 1.0,
                                                                                    0.0, 16, True)
    assert (p.stance.scale, p.stance.topic) == (3, "Cities should ban private cars from their centres.")
    assert (p.activity.attribute, p.activity.rates, p.activity.default) == (
        "activity", {"high": 0.5, "medium": 0.2, "low": 0.05}, 0.1)
    assert (p.prompt.persona, p.prompt.post_chars) == (True, 280)
    assert r.config.params["pool"]["size"] == 10_000  # normalised into the recorded config


@pytest.mark.parametrize(("scenario", "field"), [
    ({"pool": {"size": 0}}, "pool.size: Input should be greater than or equal to 1"),
    ({"pool": {"size": True}}, "pool.size: must be a number, not true/false"),
    ({"pool": {"size": 10, "seed_posts": 20}}, "pool.seed_posts: 20 is more than the pool holds (pool.size 10)"),
    ({"pool": {"seed_posts": -1}}, "pool.seed_posts: Input should be greater than or equal to 0"),
    ({"recommender": {"k": 0}}, "recommender.k: Input should be greater than or equal to 1"),
    ({"recommender": {"k": 51}}, "recommender.k: Input should be less than or equal to 50"),
    ({"recommender": {"half_life": 0}}, "recommender.half_life: Input should be greater than 0"),
    ({"recommender": {"similarity": True}}, "recommender.similarity: must be a number, not true/false"),
    ({"recommender": {"popularity": float("nan")}}, "recommender.popularity: Input should be a finite number"),
    ({"recommender": {"follow_boost": -1}}, "recommender.follow_boost: Input should be greater than or equal to 0"),
    ({"recommender": {"boost": 1}}, "recommender.boost: unknown key"),
    ({"recommender": {"interest": -0.5}}, "recommender.interest: Input should be greater than or equal to 0"),
    ({"recommender": {"interest": True}}, "recommender.interest: must be a number, not true/false"),
    ({"recommender": {"interest_dims": 0}}, "recommender.interest_dims: Input should be greater than or equal to 1"),
    ({"recommender": {"interest_dims": 257}}, "recommender.interest_dims: Input should be less than or equal to 256"),
    ({"recommender": {"record_shown": "yes"}}, "recommender.record_shown: Input should be a valid boolean"),
    ({"stance": {"scale": 0}}, "stance.scale: Input should be greater than or equal to 1"),
    ({"stance": {"scale": 11}}, "stance.scale: Input should be less than or equal to 10"),
    ({"stance": {"topic": "   "}}, "stance.topic: must not be blank"),
    ({"activity": {"rates": {"high": 1.5}}}, "activity.rates.high: Input should be less than or equal to 1"),
    ({"activity": {"rates": {"high": True}}}, "activity.rates: high: a rate is a number from 0 to 1, not true/false"),
    ({"activity": {"default": -0.1}}, "activity.default: Input should be greater than or equal to 0"),
    ({"activity": {"attribute": ""}}, "activity.attribute: String should have at least 1 character"),
    ({"prompt": {"post_chars": 5}}, "prompt.post_chars: Input should be greater than or equal to 10"),
    ({"prompt": {"posts": 5}}, "prompt.posts: unknown key"),
    ({"pools": {}}, "pools: unknown key"),
])
def test_bad_params_name_their_field(scenario, field):
    assert error_of(**scenario).startswith(field)


def test_a_run_needs_someone_to_follow():
    assert error_of(agents=1) == "agents: feed needs at least 2 agents (someone to follow)"
    resolve(RunConfig(simulation="feed", agents=2))


def test_the_topic_is_one_line():
    r = resolve(RunConfig.model_validate({"simulation": "feed", "agents": 2, "stance": {"topic": " Tax\n  sugar. "}}))
    assert r.params.stance.topic == "Tax sugar."


def test_the_answer_budget_fits_the_longest_post():
    def tokens(**scenario) -> int:
        return resolve(RunConfig.model_validate({"simulation": "feed", "agents": 2, **scenario})).config.model.max_tokens

    assert tokens() == 64 + 94  # 280 characters at 3 a token, and the JSON around them
    assert tokens(prompt={"post_chars": 30}) == 64 + 10
    assert tokens(model={"max_tokens": 99}) == 99  # the scenario's own wins


def test_the_declaration_is_valid_with_follow_edges():
    Microblog.check()
    t = Microblog.tables()
    assert (t.outcomes, t.rounds, t.grouped, t.edge_kinds) == ("feed_outcomes", "feed_rounds", False, ["follow"])
    assert [(c.name, c.type) for c in t.outcome_columns] == [
        ("stance", "BIGINT"), ("text", "VARCHAR"), ("liked", "BIGINT"), ("reposted", "BIGINT"), ("followed", "BIGINT"),
        ("unfollowed", "BIGINT")]
    assert (t.measure, t.measure_kind) == ("stance", "numeric")
    assert [c.name for c in t.summary_columns] == [
        "active_share", "posts", "likes", "reposts", "follows", "unfollows", "net_follows", "pool", "pool_new",
        "mean_stance", "var_stance", "extreme_share", "polarization"]
    titles = {name: f.title for name, f in Microblog.Summary.model_fields.items()}
    assert all(titles.values()), titles  # every summary column has a table label


def test_report_hints():
    params = FeedParams.model_validate({"stance": {"scale": 2, "topic": "Tax sugar."}, "pool": {"size": 500},
                                        "recommender": {"k": 5}, "activity": {"default": 0.25}})
    assert Microblog.measure_range(params) == (-2.0, 2.0)
    assert Microblog.tables_for(params).measure_range == (-2.0, 2.0)
    assert Microblog.describe(params) == ("a microblog on “Tax sugar.”: feeds of 5 from a pool of 500 posts, stances "
                                          "-2..2, activity by persona `activity` (otherwise 0.25 a round)")
