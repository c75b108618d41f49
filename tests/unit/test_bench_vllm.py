"""The pure pieces of `populace bench vllm`: vLLM's counters, their deltas, the KV capacity,
and the simulator's calibration."""

from __future__ import annotations

import pytest

from populace.bench.vllm import Counters, calibrate, kv_capacity, parse_counters, sim_args, within
from populace.replicas.sim import SimConfig, SimModel, render_metrics

VLLM_METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="SmolLM2-135M-Instruct"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="SmolLM2-135M-Instruct"} 500.0
vllm:prefix_cache_queries_created{engine="0",model_name="SmolLM2-135M-Instruct"} 1.7e9
vllm:prefix_cache_hits_total{engine="0",model_name="SmolLM2-135M-Instruct"} 640.0
vllm:prompt_tokens_total{engine="0",model_name="SmolLM2-135M-Instruct"} 1500.0
vllm:generation_tokens_total{engine="0",model_name="SmolLM2-135M-Instruct"} 42.0
vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="364",kv_cache_size_tokens="46592"} 1.0
"""


def test_counters_sum_engines_and_skip_other_series():
    c = parse_counters(VLLM_METRICS)
    assert c == Counters(hits=640.0, queries=1500.0, prompt=1500.0, generation=42.0)


def test_hit_rate_is_over_the_run_not_since_start():
    before = Counters(hits=900, queries=1000, prompt=1000, generation=10)
    after = Counters(hits=1000, queries=2000, prompt=2000, generation=30)
    run = after - before
    assert run.hit_rate == pytest.approx(0.1)  # not 1000/2000
    assert run.generation == 20
    assert Counters().hit_rate == 0.0
    assert (before + run) == after


def test_simulator_metrics_parse_alike():
    model = SimModel(SimConfig(block_size=4))
    msgs = [{"role": "system", "content": "x" * 400}, {"role": "user", "content": "hello"}]
    model.plan(msgs)
    model.plan(msgs)
    from populace.replicas.sim import SimStats

    c = parse_counters(render_metrics(model, SimStats()))
    assert c.queries == model.prefix_cache_queries and c.hits == model.prefix_cache_hits > 0


def test_kv_capacity_from_cache_config_info():
    assert kv_capacity(VLLM_METRICS) == (364, 128)
    assert kv_capacity("vllm:num_requests_running 0.0\n") is None


def test_calibration_shares_a_cpu_replica_among_its_sequences():
    fields = calibrate(prefill_tokens=20_000, prefill_s=10.0,  # 2,000 tokens/s, whole replica
                       decode_prompt_tokens=6_000, decode_tokens=500, decode_s=5.0,  # 3 s of it prefill
                       concurrency=8, kv_blocks=364, block_size=128, sim_per_real_token=2.0)
    assert fields == {"prefill_tokens_per_s": 500.0,  # 2,000 × 2 sim tokens per real one / 8
                      "decode_tokens_per_s": 31.25,  # 500 tokens in the 2 s left, / 8
                      "max_num_seqs": 8, "block_size": 256, "cache_blocks": 364}
    cfg = SimConfig(**fields)  # a valid simulator profile, and its command line
    assert SimConfig(**{k.removeprefix("--").replace("-", "_"): v
                        for k, v in zip(sim_args(fields)[::2], sim_args(fields)[1::2], strict=True)}) \
        == cfg.model_copy(update={"time_scale": 1.0})


def test_calibration_never_charges_decode_less_than_a_floor():
    fields = calibrate(prefill_tokens=1000, prefill_s=1.0, decode_prompt_tokens=10_000, decode_tokens=100,
                       decode_s=2.0, concurrency=1, kv_blocks=10, block_size=16, sim_per_real_token=1.0)
    assert fields["decode_tokens_per_s"] == pytest.approx(100 / 0.1)


def test_within():
    assert within(125, 100) == pytest.approx(0.25)
    assert within(80, 100) == pytest.approx(-0.2)
