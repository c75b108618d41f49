"""Interviews on the fleet, end to end on real processes: a panel planned on the vote example
(every round, a seeded half of the agents) is answered by the agent-hosts beside the next
round and recorded in table `interviews` exactly as one process answers it; the run counts as
recorded once the answers are in; the rounds are the rounds of the same run without
interviews."""

from __future__ import annotations

import asyncio
from pathlib import Path

import duckdb
import pytest
import yaml

from populace.client.prepare import prepare_file
from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus
from populace.graph.serial import loads
from populace.population.cast import cast_from_jsonl
from populace.sdk.local import run_local

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PANEL = [
    {"id": "panel", "after": "every", "sample": 0.5, "questions": [
        {"id": "trust", "text": "How much do you trust the other voters?", "labels": ["none", "some", "a lot"]},
        {"id": "turnout", "text": "Will you vote in the next election?", "options": ["yes", "no", "maybe"]}]},
    {"id": "exit", "after": [3], "mode": "together", "questions": [
        {"id": "sure", "text": "How sure are you of your vote, from 0 to 100?", "min": 0, "max": 100},
        {"id": "why", "text": "Why did you vote as you did?", "max_chars": 120}]},
]
DROP = ("run_id", "latency_ms", "host_id", "request")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    db = tmp_path_factory.mktemp("interviews") / "populace.duckdb"
    s = Stack(hosts=2, db=str(db), env={"POPULACE_STORAGE": "memory"})
    with s.up(timeout=90):
        yield s


def scenario(tmp_path: Path, name: str, **changes):
    data = {**yaml.safe_load((EXAMPLES / name).read_text()), **changes}
    path = EXAMPLES / f".{tmp_path.name}-{name}"  # beside the original: its relative paths resolve the same
    path.write_text(yaml.safe_dump(data))
    try:
        return prepare_file(path)
    finally:
        path.unlink()


def fleet(stack: Stack, prepared):
    async def go():
        nc = await bus.connect(stack.url, "e2e-interviews")
        try:
            return await play(nc, prepared.config, personas=prepared.personas, graph=prepared.graph_blobs,
                              manifest=prepared.manifest, stall_s=120)
        finally:
            await nc.close()

    return asyncio.run(go())


def local(prepared):
    cast = cast_from_jsonl(prepared.personas) if prepared.personas is not None else None
    graph = loads(prepared.graph) if prepared.graph is not None else None
    return asyncio.run(run_local(prepared.resolved, cast=cast, graph=graph))


def rows(db: str, run_id: str, table: str, order: str) -> list[dict]:
    with duckdb.connect(db, read_only=True) as con:
        cur = con.execute(f'SELECT * FROM "{table}" WHERE run_id = ? ORDER BY {order}', [run_id])
        names = [d[0] for d in cur.description]
        return [{k: v for k, v in zip(names, r) if k not in DROP} for r in cur.fetchall()]


def local_rows(columns: dict[str, list], order: tuple[str, ...]) -> list[dict]:
    keys = [k for k in columns if k not in DROP]
    out = [dict(zip(keys, r)) for r in zip(*(columns[k] for k in keys))]
    return sorted(out, key=lambda r: tuple(r[k] for k in order))


def test_a_planned_panel_on_the_fleet_answers_as_one_process(stack, tmp_path):
    prepared = scenario(tmp_path, "vote.yaml", agents=120, interviews=PANEL, model={"latency_s": 0.02, "seed": 3})
    out = fleet(stack, prepared)
    assert out.status == "completed", out.reason
    here = local(prepared)
    order = ("after_round", "survey", "agent_id", "question")
    fleet_answers = rows(stack.db, out.run_id, "interviews", ", ".join(order))
    assert fleet_answers == local_rows(here.interviews, order)
    assert len(fleet_answers) == out.recorded.answers > 0 and out.recorded.answers_missing == 0
    assert all(r["valid"] for r in fleet_answers)
    # the panel: the same half of the agents after every round
    panel = {n: {r["agent_id"] for r in fleet_answers if r["survey"] == "panel" and r["after_round"] == n}
             for n in (1, 2, 3)}
    assert panel[1] == panel[2] == panel[3] and 30 < len(panel[1]) < 90
    # the rounds are those of the run without interviews
    plain = local(scenario(tmp_path, "vote.yaml", agents=120, model={"latency_s": 0.02, "seed": 3}))
    tables = prepared.resolved.tables()
    assert rows(stack.db, out.run_id, tables.outcomes, "round, agent_id") == local_rows(plain.outcomes,
                                                                                          ("round", "agent_id"))
    with duckdb.connect(stack.db, read_only=True) as con:
        asked = con.execute("SELECT survey, position, question, kind FROM interview_questions WHERE run_id = ? "
                            "AND after_round = 3 AND position >= 0 ORDER BY survey, position",
                            [out.run_id]).fetchall()
        calls = con.execute("SELECT sum(llm_calls) FROM interview_usage WHERE run_id = ?", [out.run_id]).fetchone()
        round_calls = con.execute(f'SELECT sum(llm_calls) FROM "{tables.rounds}" WHERE run_id = ?',
                                  [out.run_id]).fetchone()
    assert asked == [("exit", 0, "sure", "number"), ("exit", 1, "why", "text"),
                     ("panel", 0, "trust", "likert"), ("panel", 1, "turnout", "options")]
    # the interviews' calls are counted apart: one per question for the panel, one per agent for `exit`
    assert calls[0] == here.interview_calls == len(panel[1]) * 2 * 3 + 120
    assert round_calls[0] == 120 * 3
