"""The simulated provider's limits, pure (populace.replicas.sim.RateWindow): what it counts in its
sliding minute, what it refuses, and the Retry-After it gives; and its seeded latency jitter."""

from __future__ import annotations

import math
import statistics

import pytest

from populace.replicas.sim import RateWindow, SimConfig, SimReplica, retry_after_header


def test_requests_per_minute_slide_and_refused_requests_count_too():
    w = RateWindow(requests_per_min=3, minute_s=60)
    assert [w.admit(t, 10) for t in (0.0, 1.0, 2.0)] == [None, None, None]
    refused = w.admit(10.0, 10)
    # four in the window; a retry fits once two have left: the one received at 1.0 leaves at 61.0
    assert refused is not None and refused.limit == "requests"
    assert refused.retry_after_s == pytest.approx(51.0)
    assert "Limit 3" in refused.message
    # the refused request counts (as OpenAI's do): at 60.5 the first has left, three remain
    assert w.admit(60.5, 10) is not None
    assert w.received(60.5) == 4  # 1.0, 2.0, 10.0 and 60.5
    assert w.admit(62.5, 10) is None  # 1.0 and 2.0 gone: 10.0, 60.5 (refused) and this one
    assert w.max_received == 4


def test_a_request_leaves_the_window_exactly_a_minute_after_it_came():
    w = RateWindow(requests_per_min=1, minute_s=2.0)
    assert w.admit(0.0, 1) is None
    refused = w.admit(1.5, 1)
    assert refused is not None and refused.retry_after_s == pytest.approx(2.0)  # the 1.5 one must leave too
    assert w.admit(3.5, 1) is None  # 0.0 and 1.5 both left at 3.5 (the edge is excluded)


def test_tokens_per_minute_count_prompt_plus_max_tokens_of_admitted_requests():
    w = RateWindow(tokens_per_min=100, minute_s=60)
    assert w.admit(0.0, 40) is None
    assert w.admit(5.0, 40) is None
    refused = w.admit(6.0, 40)  # 120 > 100: the 0.0 request (40) must leave, at 60.0
    assert refused is not None and refused.limit == "tokens"
    assert refused.retry_after_s == pytest.approx(54.0)
    assert w.admit(60.0, 40) is None  # the refused one took no tokens: 40 (at 5.0) + 40


def test_a_request_larger_than_the_token_limit_never_fits():
    w = RateWindow(tokens_per_min=100)
    refused = w.admit(0.0, 101)
    assert refused is not None and math.isinf(refused.retry_after_s)
    assert "too large" in refused.message


def test_without_limits_it_only_counts():
    w = RateWindow(minute_s=10)
    for t in range(30):
        assert w.admit(float(t) / 2, 10**9) is None
    assert w.max_received == 20 and w.received(15.0) == 19  # (5.0, 14.5]


def test_retry_after_is_whole_seconds_rounded_up():
    assert [retry_after_header(x) for x in (0.0, 0.2, 1.0, 1.01, 59.5)] == ["1", "1", "1", "2", "60"]


def test_jitter_is_seeded_per_request_and_has_the_mean_asked():
    replica = SimReplica(SimConfig(latency_jitter_s=0.2, seed=7))
    msgs = [[{"role": "user", "content": f"question {i}"}] for i in range(4000)]
    draws = [replica.jitter_s(m, seed=3) for m in msgs]
    assert draws == [replica.jitter_s(m, seed=3) for m in msgs]  # the same request waits the same
    assert draws[:50] != [SimReplica(SimConfig(latency_jitter_s=0.2, seed=8)).jitter_s(m, 3) for m in msgs[:50]]
    assert min(draws) >= 0 and statistics.fmean(draws) == pytest.approx(0.2, rel=0.08)
    assert SimReplica(SimConfig()).jitter_s(msgs[0]) == 0.0


def test_the_key_is_never_in_the_config_repr():
    cfg = SimConfig(api_key="sk-sim-secret-123456")
    assert "sk-sim-secret" not in repr(cfg) and "sk-sim-secret" not in str(cfg.model_dump())
