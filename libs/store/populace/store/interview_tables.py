"""The interviews' tables as the recorder writes them (`interviews`, `interview_questions`,
`interview_usage`, `interview_requests`, `_interview_orders`): DuckDB DDL and nothing else, so
the recorder can create them without loading the analysis (scipy, plotly)."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS interviews (
    run_id VARCHAR, after_round INTEGER, survey VARCHAR, question VARCHAR, agent_id BIGINT, answer VARCHAR,
    value DOUBLE, raw VARCHAR, valid BOOLEAN, error VARCHAR, latency_ms DOUBLE, request VARCHAR, host_id VARCHAR
);
CREATE TABLE IF NOT EXISTS interview_questions (
    run_id VARCHAR, after_round INTEGER, survey VARCHAR, request VARCHAR, mode VARCHAR, position INTEGER,
    question VARCHAR, kind VARCHAR, text VARCHAR, spec JSON
);
CREATE TABLE IF NOT EXISTS interview_usage (
    run_id VARCHAR, after_round INTEGER, survey VARCHAR, request VARCHAR, host_id VARCHAR, llm_calls BIGINT,
    prompt_tokens BIGINT, completion_tokens BIGINT, infra_retries BIGINT
);
-- a run with `models:`: the prompt tokens the providers served from cache, and the dollars at the prices
ALTER TABLE interview_usage ADD COLUMN IF NOT EXISTS cached_tokens BIGINT;
ALTER TABLE interview_usage ADD COLUMN IF NOT EXISTS dollars DOUBLE;
-- post-hoc interviews (populace interview): each request as the orchestrator placed or refused it,
-- and its orders (which host answers for which agent ranges)
CREATE TABLE IF NOT EXISTS interview_requests (
    run_id VARCHAR, request VARCHAR, after_round INTEGER, survey VARCHAR, expected BIGINT, error VARCHAR,
    placed_at TIMESTAMP, recorded_at TIMESTAMP
);
CREATE TABLE IF NOT EXISTS _interview_orders (run_id VARCHAR, request VARCHAR, host_id VARCHAR, ranges JSON);
-- what each order asks (its survey, the round after which, whom of its ranges): an answer batch is
-- checked against it, never against the first batch that came
ALTER TABLE _interview_orders ADD COLUMN IF NOT EXISTS after_round INTEGER;
ALTER TABLE _interview_orders ADD COLUMN IF NOT EXISTS survey JSON;
ALTER TABLE _interview_orders ADD COLUMN IF NOT EXISTS sample DOUBLE;
ALTER TABLE _interview_orders ADD COLUMN IF NOT EXISTS agents JSON;
"""
