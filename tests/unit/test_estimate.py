"""The pilot's arithmetic: how many agents it plays, and its LLM work scaled to the run."""

from __future__ import annotations

import math
import random

import pytest

from populace.client.estimate import extrapolate, pilot_agents
from populace.core.contracts import Usage


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
