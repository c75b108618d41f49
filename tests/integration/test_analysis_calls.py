"""`call_stats`, `total_calls` and `model_of`: what `populace results` and its --json say about
the model's work, read from llm_calls rows and the manifest."""

from __future__ import annotations

import duckdb
import pytest

from populace.analysis.calls import call_stats, model_of, model_stats, total_calls

# round, agent, replica, prompt tokens, completion tokens, latency, attempts, valid, reasks
ROWS = [
    (1, 0, "r-a", 100, 10, 100.0, 1, True, 0),
    (1, 1, "r-a", 110, 12, 200.0, 2, True, 1),   # re-asked once
    (1, 2, "r-b", 120, 14, 300.0, 3, False, 1),  # re-asked once and retried once on another replica
    (1, 3, "r-b", 130, 16, 400.0, 1, True, 0),
    (2, 0, "r-a", 200, 20, 50.0, 1, True, 0),
]


def make(con, with_reasks: bool = True) -> None:
    con.execute("CREATE TABLE llm_calls (run_id VARCHAR, round INTEGER, agent_id BIGINT, replica VARCHAR, "
                "prompt_tokens INTEGER, completion_tokens INTEGER, latency_ms DOUBLE, attempts INTEGER, "
                "valid BOOLEAN, batch_id VARCHAR)")
    if with_reasks:
        con.execute("ALTER TABLE llm_calls ADD COLUMN reasks INTEGER")
    for r in ROWS:
        con.execute(f"INSERT INTO llm_calls VALUES ('run', ?, ?, ?, ?, ?, ?, ?, ?, 'b'{', ?' if with_reasks else ''})",
                    list(r if with_reasks else r[:-1]))
    con.execute("INSERT INTO llm_calls BY NAME SELECT 'other' AS run_id, 1 AS round, 9 AS agent_id, 'r-z' AS replica, "
                "1 AS attempts")


def test_per_round_counts_tokens_latency_and_replicas():
    con = duckdb.connect()
    make(con)
    stats = call_stats(con, "run")
    assert set(stats) == {1, 2}
    one = stats[1]
    assert (one["calls"], one["attempts"], one["reasks"], one["replica_retries"], one["valid"]) == (4, 7, 2, 1, 3)
    assert (one["prompt_tokens"], one["completion_tokens"]) == (460, 52)
    assert one["latency_ms_p50"] == pytest.approx(250.0) and one["latency_ms_max"] == 400.0
    assert one["latency_ms_p95"] == pytest.approx(385.0)  # interpolated, like numpy's default
    assert one["replicas"] == {"r-a": 2, "r-b": 2}
    total = total_calls(stats)
    assert (total["calls"], total["attempts"], total["reasks"], total["replica_retries"]) == (5, 8, 2, 1)
    assert total["prompt_tokens"] == 660 and total["replicas"] == {"r-a": 3, "r-b": 2}
    assert total["latency_ms_max"] == 400.0


def test_older_files_without_reasks_say_unknown_not_zero():
    con = duckdb.connect()
    make(con, with_reasks=False)
    one = call_stats(con, "run")[1]
    assert one["reasks"] is None and one["replica_retries"] is None and one["attempts"] == 7
    assert total_calls(call_stats(con, "run"))["reasks"] is None
    assert call_stats(duckdb.connect(), "run") == {} and total_calls({}) is None  # no llm_calls table at all


def test_model_names_come_from_the_manifest_and_the_replicas_that_answered():
    info = {"model": {"backend": "local"},
            "manifest": {"model": {"backend": "local", "name": None,
                                   "replicas": [{"replica_id": "r-a", "kind": "llamacpp", "model": "SmolLM2"}]}}}
    stats = {1: {"replicas": {"r-a": 3, "r-b": 1}}}
    assert model_of(info, stats) == {"backend": "local", "name": "SmolLM2", "replicas": ["r-a", "r-b"]}
    assert model_of({"model": {"backend": "dummy"}}) == {"backend": "dummy", "name": None, "replicas": []}


def priced(con) -> None:
    """make()'s rows as a run with `models:` records them: each call's model, cached tokens and dollars."""
    make(con)
    for name, kind in (("model", "VARCHAR"), ("cached_tokens", "INTEGER"), ("dollars", "DOUBLE")):
        con.execute(f"ALTER TABLE llm_calls ADD COLUMN {name} {kind}")
    con.execute("UPDATE llm_calls SET model = CASE WHEN agent_id % 2 = 0 THEN 'a' ELSE 'b' END, "
                "cached_tokens = prompt_tokens // 2, dollars = CASE WHEN agent_id % 2 = 0 THEN prompt_tokens / 1e6 END "
                "WHERE run_id = 'run'")
    con.execute("CREATE TABLE agent_models (run_id VARCHAR, agent_id BIGINT, model VARCHAR)")
    con.execute("INSERT INTO agent_models VALUES ('run', 0, 'a'), ('run', 1, 'b'), ('run', 2, 'a'), ('run', 3, 'b'), "
                "('run', 4, 'c')")


def test_cached_tokens_and_dollars_per_round_and_per_model():
    con = duckdb.connect()
    priced(con)
    stats = call_stats(con, "run")
    assert stats[1]["cached_tokens"] == 50 + 55 + 60 + 65
    assert stats[1]["dollars"] == pytest.approx((100 + 120) / 1e6) and stats[2]["dollars"] == pytest.approx(2e-4)
    total = total_calls(stats)
    assert total["cached_tokens"] == 330 and total["dollars"] == pytest.approx(4.2e-4)
    by_model = model_stats(con, "run")
    assert list(by_model) == ["a", "b", "c"]
    a, b, c = by_model.values()
    assert (a["agents"], a["calls"], a["prompt_tokens"], a["cached_tokens"], a["completion_tokens"]) == (
        2, 3, 420, 210, 44)
    assert a["dollars"] == pytest.approx(4.2e-4) and a["latency_ms_mean"] == pytest.approx(150.0)
    assert (b["agents"], b["calls"], b["dollars"]) == (2, 2, None)  # a model without prices: no dollars, not $0
    assert (c["agents"], c["calls"], c["latency_ms_mean"]) == (1, 0, None)  # assigned, never called


def test_files_from_before_models_have_no_cost_and_no_models():
    con = duckdb.connect()
    make(con)
    one = call_stats(con, "run")[1]
    assert one["cached_tokens"] == 0 and one["dollars"] is None
    assert total_calls(call_stats(con, "run"))["dollars"] is None
    assert model_stats(con, "run") == {} and model_stats(duckdb.connect(), "run") == {}
