"""The pilot's arithmetic: how many agents it plays, and its LLM work scaled to the run (per
model: dollars at its prices, wall time at its declared limits); a run's dollars projected to
its end as its rounds close."""

from __future__ import annotations

import math
import random

import pytest

from populace.client.estimate import duration, extrapolate, pilot_agents, projected
from populace.client.progress import Spending
from populace.core.contracts import ModelEndpoint, ModelUse, RoundResult, Usage


def test_the_pilot_plays_a_share_of_the_agents_at_least_twenty_at_most_all():
    assert pilot_agents(1_000_000) == 10_000
    assert pilot_agents(1000) == 20 and pilot_agents(5) == 5
    assert pilot_agents(1000, share=0.5) == 500
    with pytest.raises(ValueError, match="--pilot"):
        pilot_agents(100, share=0)


def usage_of(tokens: list[int]) -> Usage:
    return Usage(llm_calls=len(tokens), prompt_tokens=sum(tokens), completion_tokens=0,
                 tokens_sq=float(sum(t * t for t in tokens)))


def test_scaled_to_the_run_with_an_interval_that_covers_the_truth():
    rng = random.Random(4)
    population = [rng.randint(100, 300) for _ in range(100_000)]  # tokens per call of every agent
    truth = sum(population) * 3  # 3 rounds, one call per agent per round
    covered = 0
    for _ in range(200):
        pilot = rng.sample(population, 200)
        est = extrapolate(len(population), 3, 200, usage_of(pilot))
        assert est.calls == 300_000
        covered += est.tokens_low <= truth <= est.tokens_high
    assert 0.88 <= covered / 200 <= 0.99  # a 95% interval, up to sampling noise
    est = extrapolate(100_000, 3, 200, usage_of([200] * 200))
    assert (est.tokens, est.tokens_low, est.tokens_high, est.tokens_per_call_sd) == (60_000_000, 60_000_000,
                                                                                   60_000_000, 0.0)


def test_agents_that_call_twice_and_a_model_without_tokens():
    est = extrapolate(1000, 2, 20, Usage(llm_calls=40))
    assert est.calls == 4000 and est.tokens == 0 and not est.counted_tokens
    est = extrapolate(1000, 1, 20, usage_of([10, 30]))
    assert math.isclose(est.tokens_per_call, 20) and math.isclose(est.tokens_per_call_sd, math.sqrt(200))


# --- per model: dollars, cached tokens, wall time under the declared limits ------------------------

CHEAP = ModelEndpoint(name="cheap", kind="sim", share=0.75, prices={"input": 1.0, "cached_input": 0.25, "output": 2.0},
                      limits={"requests_per_min": 600, "tokens_per_min": 100_000, "concurrency": 4})
DEAR = ModelEndpoint(name="dear", kind="sim", share=0.25, prices={"input": 10.0, "output": 30.0})


def use(calls: int, prompt: int, cached: int, completion: int, m: ModelEndpoint) -> ModelUse:
    return ModelUse(llm_calls=calls, prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion,
                    dollars=m.prices.dollars(prompt, cached, completion))


def pilot_of(**by_model: ModelUse) -> Usage:
    total = Usage()
    for name, u in by_model.items():
        total = total + Usage(llm_calls=u.llm_calls, prompt_tokens=u.prompt_tokens, cached_tokens=u.cached_tokens,
                              completion_tokens=u.completion_tokens, dollars=u.dollars, by_model={name: u},
                              tokens_sq=u.llm_calls * ((u.prompt_tokens + u.completion_tokens) / u.llm_calls) ** 2)
    return total


def test_each_models_work_is_scaled_by_its_own_agents_and_priced_at_its_prices():
    # the pilot: 15 agents on cheap, 5 on dear (its share of each model's), one call each
    pilot = pilot_of(cheap=use(15, 1500, 600, 300, CHEAP), dear=use(5, 500, 0, 100, DEAR))
    est = extrapolate(1000, 3, 20, pilot, [CHEAP, DEAR], {"cheap": 750, "dear": 250}, {"cheap": 15, "dear": 5})
    cheap, dear = est.models
    assert (cheap.agents, cheap.pilot_agents, dear.agents) == (750, 15, 250)
    assert cheap.calls == 15 * 50 * 3 and dear.calls == 5 * 50 * 3 and est.calls == 3000
    assert cheap.cached_tokens == 600 * 150 and est.cached_tokens == 90_000
    assert est.tokens == (1800 * 150 + 600 * 150)
    # dollars: each model's pilot dollars × its own scale, then summed
    assert math.isclose(cheap.dollars, CHEAP.prices.dollars(1500 * 150, 600 * 150, 300 * 150))
    assert math.isclose(dear.dollars, DEAR.prices.dollars(500 * 150, 0, 100 * 150))
    assert math.isclose(est.dollars, cheap.dollars + dear.dollars) and est.priced
    assert not cheap.from_others and not dear.from_others


def test_the_slowest_declared_limit_sets_the_pace_and_a_model_without_limits_is_named():
    pilot = pilot_of(cheap=use(15, 1500, 600, 300, CHEAP), dear=use(5, 500, 0, 100, DEAR))
    est = extrapolate(1000, 3, 20, pilot, [CHEAP, DEAR], {"cheap": 750, "dear": 250}, {"cheap": 15, "dear": 5},
                      latency_s={"cheap": 2.0})
    cheap, dear = est.models
    assert cheap.minutes_requests == 2250 / 600  # 3.75 min
    assert cheap.minutes_tokens == 2250 * 120 / 100_000  # 2.7 min
    assert cheap.minutes_concurrency == 2250 * 2.0 / 4 / 60  # 18.75 min: 4 in flight, 2 s each
    assert cheap.binding == ("concurrency 4", 18.75) and est.minutes == 18.75
    assert dear.binding is None and not dear.limited and est.unlimited == ["dear"]
    no_latency = extrapolate(1000, 3, 20, pilot, [CHEAP, DEAR], {"cheap": 750, "dear": 250}, {"cheap": 15, "dear": 5})
    assert no_latency.models[0].binding == ("requests per minute", 3.75)
    assert extrapolate(1000, 3, 20, pilot, [DEAR], {"dear": 1000}, {"dear": 20}).minutes is None


def test_a_model_no_pilot_agent_had_is_estimated_from_the_pilots_agents_overall():
    pilot = pilot_of(cheap=use(20, 2000, 0, 400, CHEAP))
    est = extrapolate(1000, 1, 20, pilot, [CHEAP, DEAR], {"cheap": 990, "dear": 10}, {"cheap": 20, "dear": 0})
    dear = est.models[1]
    assert dear.from_others and dear.calls == 10 and dear.prompt_tokens == 1000
    assert math.isclose(dear.dollars, DEAR.prices.dollars(1000, 0, 200))


def test_without_models_the_pilot_is_scaled_as_one_and_costs_nothing_known():
    est = extrapolate(1000, 2, 20, Usage(llm_calls=20, prompt_tokens=2000, cached_tokens=500, completion_tokens=400))
    assert (est.calls, est.tokens, est.cached_tokens, est.dollars, est.models, est.priced) == (
        2000, 240_000, 50_000, 0.0, (), False)
    assert est.minutes is None


def test_the_projection_is_the_pace_so_far_times_the_rounds():
    assert projected(0.3, 3, 10) == pytest.approx(1.0)
    assert projected(0.0, 0, 10) is None
    assert projected(1.0, 12, 10) == 1.0  # a fork or resume past its planned rounds: what was spent
    assert [duration(m) for m in (0.2, 12.4, 200, 5000)] == ["12 s", "12 min", "3 h 20 min", "3.5 days"]


def test_the_live_view_counts_each_rounds_dollars_once_and_projects_them():
    def closed(n: int, dollars: float, asked: float = 0.0) -> RoundResult:
        return RoundResult(run_id="r", round=n, n=1, n_valid=1, summary={}, observation={}, closed_at=0.0,
                           usage=Usage(dollars=dollars), interviews=Usage(dollars=asked))

    s = Spending(rounds=4)
    assert s.text() == "dollars: $0 spent, projected after the first round"
    s.add(closed(1, 0.25))
    s.add(closed(1, 0.25))  # decided again after a re-placement: once
    s.add(closed(2, 0.2, asked=0.05))
    assert (s.spent, s.done) == (pytest.approx(0.5), 2)
    assert s.text() == "dollars: $0.50 spent, ~$1.00 by round 4"
    resumed = Spending(rounds=4, spent=0.5, rounds_done=2)  # a resume: what was spent before it
    resumed.add(closed(2, 9.0))  # a round before the resume point, seen again: already counted
    resumed.add(closed(3, 0.25))
    assert resumed.text() == "dollars: $0.75 spent, ~$1.00 by round 4"
