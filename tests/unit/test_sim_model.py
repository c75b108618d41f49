"""The simulated vLLM replica's pure model: token counting, block prefix cache, plans, answers, metrics."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from populace.replicas.sim import (
    SimConfig,
    SimModel,
    SimStats,
    count_tokens,
    render_metrics,
    response_schema,
)

SYSTEM = "You are a player in a guessing game. " * 40  # ~1440 chars, ~360 tokens: many 16-token blocks


def msgs(system: str, user: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def schema_rf(**guess) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "g", "schema": {
        "type": "object", "properties": {"guess": {"type": "integer", **guess}}, "required": ["guess"]}}}


def test_count_tokens():
    assert count_tokens("") == 0
    assert count_tokens("a") == 1
    assert count_tokens("abcd") == 1
    assert count_tokens("abcde") == 2
    assert count_tokens("x" * 400) == 100


def test_config_rejects_unknown_and_bad_values():
    with pytest.raises(ValidationError):
        SimConfig(nope=1)
    with pytest.raises(ValidationError):
        SimConfig(decode_tokens_per_s=0)
    with pytest.raises(ValidationError):
        SimConfig(max_num_seqs=0)


def test_shared_long_prefix_hits_the_cache():
    m = SimModel(SimConfig())
    first = m.plan(msgs(SYSTEM, "round 1"), 16)
    assert first.cached_tokens == 0
    second = m.plan(msgs(SYSTEM, "round 2, a different question"), 16)
    # every full block inside the shared system prompt hits; the block with the user text does not
    shared_blocks = len("system\n" + SYSTEM) // (16 * 4)
    assert second.cached_tokens >= (shared_blocks - 1) * 16
    assert second.cached_tokens % 16 == 0
    assert second.cached_tokens < second.prompt_tokens
    assert second.prefill_s < first.prefill_s


def test_prefill_time_covers_only_uncached_tokens():
    cfg = SimConfig(prefill_tokens_per_s=1000, decode_tokens_per_s=10)
    m = SimModel(cfg)
    a = m.plan(msgs(SYSTEM, "q1"), 16)
    assert a.prefill_s == pytest.approx(a.prompt_tokens / 1000)
    assert a.decode_s == pytest.approx(a.completion_tokens / 10)
    b = m.plan(msgs(SYSTEM, "q2"), 16)
    assert b.cached_tokens > 0
    assert b.prefill_s == pytest.approx((b.prompt_tokens - b.cached_tokens) / 1000)


def test_no_hit_when_the_first_block_differs():
    m = SimModel(SimConfig())
    m.plan(msgs("A" + SYSTEM, "q"), 16)
    other = m.plan(msgs("B" + SYSTEM, "q"), 16)  # same text after the first character
    assert other.cached_tokens == 0


def test_a_block_hits_only_with_its_whole_prefix():
    m = SimModel(SimConfig(block_size=16))  # 64 chars a block
    head, body = "user\n" + "a" * 59, "user\n" + "b" * 59  # two blocks of 64 chars each
    m.plan([{"role": "user", "content": head[5:] + body + "c" * 200}], 16)
    # this prompt's first block has the same text as the cached prompt's *second* block
    moved = m.plan([{"role": "user", "content": body[5:] + "c" * 200}], 16)
    assert moved.cached_tokens == 0


def test_identical_prompt_still_computes_its_last_token():
    m = SimModel(SimConfig(block_size=16))
    text = "y" * (16 * 4 * 10 - len("user\n\n"))  # exactly 10 full blocks
    m.plan([{"role": "user", "content": text}], 16)
    again = m.plan([{"role": "user", "content": text}], 16)
    assert again.prompt_tokens == 160
    assert again.cached_tokens == 9 * 16  # like vLLM: the last block is recomputed
    assert again.prefill_s > 0


def test_lru_evicts_the_oldest_blocks():
    cfg = SimConfig(block_size=4, cache_blocks=8)  # 16 chars a block
    m = SimModel(cfg)
    p1 = msgs("1" * 100, "")
    p2 = msgs("2" * 100, "")
    p3 = msgs("3" * 100, "")
    m.plan(p1, 16)
    assert m.cached_blocks() <= 8
    assert m.plan(p1, 16).cached_tokens > 0  # still there
    m.plan(p2, 16)
    m.plan(p3, 16)  # p1's blocks are now the least recently used and pushed out
    assert m.cached_blocks() == 8
    assert m.plan(p1, 16).cached_tokens == 0
    assert m.plan(p1, 16).cached_tokens > 0  # and re-cached


def test_lru_use_refreshes_recency():
    cfg = SimConfig(block_size=4, cache_blocks=8)  # 16 chars a block
    m = SimModel(cfg)
    a, b, c = (msgs(ch * 50, "") for ch in "abc")  # 64 chars each: 4 full blocks, two prompts fill the cache
    m.plan(a, 16)
    m.plan(b, 16)
    m.plan(a, 16)  # a is now more recent than b
    m.plan(c, 16)  # evicts b, not a
    assert m.plan(a, 16).cached_tokens > 0
    assert m.plan(b, 16).cached_tokens == 0


def test_counters_track_queried_and_hit_tokens():
    m = SimModel(SimConfig())
    a = m.plan(msgs(SYSTEM, "q1"), 16)
    b = m.plan(msgs(SYSTEM, "q2"), 16)
    assert m.prefix_cache_queries == a.prompt_tokens + b.prompt_tokens
    assert m.prefix_cache_hits == b.cached_tokens > 0


def test_answer_is_deterministic_json_within_bounds():
    m1, m2 = SimModel(SimConfig(seed=3)), SimModel(SimConfig(seed=3))
    p = msgs("sys", "pick a number")
    a1, a2 = m1.plan(p, 16, schema_rf(minimum=0, maximum=100)), m2.plan(p, 16, schema_rf(minimum=0, maximum=100))
    assert a1.content == a2.content
    guess = json.loads(a1.content)["guess"]
    assert isinstance(guess, int) and 0 <= guess <= 100
    assert a1.completion_tokens == count_tokens(a1.content)
    assert a1.finish_reason == "stop"
    # varies with the last user message and the seed
    rf = schema_rf(minimum=0, maximum=100)
    guesses = {json.loads(m1.plan(msgs("sys", f"q{i}"), 16, rf).content)["guess"] for i in range(50)}
    assert len(guesses) > 10
    others = {json.loads(SimModel(SimConfig(seed=s)).plan(p, 16, rf).content)["guess"] for s in range(20)}
    assert len(others) > 3
    # without a schema a model answers free text (here: a number)
    assert m1.plan(p, 16).content.isdigit()


def test_answer_respects_the_schema_maximum():
    m = SimModel(SimConfig())
    rf = schema_rf(minimum=0, maximum=5)
    seen = {json.loads(m.plan(msgs("s", f"u{i}"), 16, rf).content)["guess"] for i in range(200)}
    assert seen <= set(range(6))
    assert len(seen) == 6
    ints = {json.loads(m.plan(msgs("s", f"v{i}"), 16, schema_rf(minimum=10, exclusiveMaximum=20)).content)["guess"]
            for i in range(200)}
    assert ints <= set(range(10, 20)) and len(ints) == 10
    assert response_schema(schema_rf(maximum=5))["properties"]["guess"]["maximum"] == 5
    assert response_schema({"type": "json_object"}) is None and response_schema(None) is None


def test_max_tokens_truncates_with_finish_reason_length():
    m = SimModel(SimConfig(max_tokens_default=16))
    p = m.plan(msgs("s", "u"), 2, schema_rf(minimum=0, maximum=100))
    assert p.completion_tokens == 2 and p.finish_reason == "length"
    assert len(p.content) == 8
    assert m.plan(msgs("s", "u"), None).finish_reason == "stop"


def test_metrics_text_has_vllm_names_and_valid_lines():
    m = SimModel(SimConfig(model_name="qwen", cache_blocks=100))
    m.plan(msgs(SYSTEM, "a"), 16)
    m.plan(msgs(SYSTEM, "b"), 16)
    stats = SimStats(running=2, waiting=3, active_blocks=25, prompt_tokens_total=7,
                     generation_tokens_total=8, request_success_total=2)
    text = render_metrics(m, stats)
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert line.split()[1] in ("HELP", "TYPE")
            continue
        name_labels, value = line.rsplit(" ", 1)
        samples[name_labels] = float(value)
    lab = '{model_name="qwen"}'
    assert samples["vllm:num_requests_running" + lab] == 2
    assert samples["vllm:num_requests_waiting" + lab] == 3
    assert samples["vllm:kv_cache_usage_perc" + lab] == 0.25
    assert samples["vllm:prefix_cache_queries_total" + lab] == m.prefix_cache_queries
    assert samples["vllm:prefix_cache_hits_total" + lab] == m.prefix_cache_hits > 0
    assert samples["vllm:prompt_tokens_total" + lab] == 7
    assert samples["vllm:generation_tokens_total" + lab] == 8
    assert samples["vllm:request_success_total" + lab] == 2
    assert "# TYPE vllm:prefix_cache_hits_total counter" in text
    assert "# TYPE vllm:num_requests_waiting gauge" in text
    assert text.endswith("\n")


def test_cli_rejects_invalid_config():
    from populace.replicas.sim import main

    with pytest.raises(SystemExit) as exc:
        main(["--port", "0", "--decode-tokens-per-s", "0"])
    assert exc.value.code == 2
