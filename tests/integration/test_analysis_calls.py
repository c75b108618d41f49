"""`call_stats`, `total_calls` and `model_of`: what `populace results` and its --json say about
the model's work, read from llm_calls rows and the manifest."""

from __future__ import annotations

import duckdb
import pytest

from populace.analysis.calls import call_stats, model_of, total_calls

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
