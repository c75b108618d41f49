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
from example_copies import example_copy

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
def stack(stacks):
    """Two agent-hosts, each with its own host id and share, in one process: no service is killed
    or measured alone."""
    return stacks(hosts=2, env={"POPULACE_STORAGE": "memory"}, one_process=True)


def scenario(tmp_path: Path, name: str, **changes):
    return prepare_file(example_copy(tmp_path, name, **changes))


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


def test_a_fork_of_a_panel_run_owes_only_its_own_rounds_answers(stack, tmp_path):
    """A fork after round 2 of a 4-round run with a panel after every round plays rounds 3 and 4
    and owes their panel waves alone: its parent answered rounds 1 and 2. It is recorded as soon
    as those are in (it waited 10 minutes for waves it never plays, then said `completed`);
    `play` would stall on it otherwise (no event for 60 s)."""
    from populace.core.contracts import Restore
    from populace.core.interviews import respondents

    prepared = scenario(tmp_path, "vote.yaml", agents=60, rounds=4, interviews=PANEL[:1],
                        model={"latency_s": 0.0, "seed": 4})
    parent = fleet(stack, prepared)
    assert parent.status == "completed", parent.reason

    async def fork():
        nc = await bus.connect(stack.url, "e2e-interviews-fork")
        try:
            return await play(nc, prepared.config, manifest=prepared.manifest, stall_s=60,
                              fork=Restore(run_id=parent.run_id, round=2))
        finally:
            await nc.close()

    out = asyncio.run(fork())
    assert out.status == "completed", out.reason
    half = respondents(60, seed=prepared.config.seed, survey_id="panel", sample=0.5).size
    assert 15 < half < 45
    assert (parent.recorded.answers, parent.recorded.answers_missing) == (4 * half * 2, 0)
    assert (out.recorded.answers, out.recorded.answers_missing) == (2 * half * 2, 0)
    with duckdb.connect(stack.db, read_only=True) as con:
        waves = con.execute("SELECT after_round, count(*), count(DISTINCT agent_id) FROM interviews WHERE run_id = ? "
                            "GROUP BY 1 ORDER BY 1", [out.run_id]).fetchall()
        status = con.execute("SELECT status FROM runs WHERE run_id = ?", [out.run_id]).fetchone()
    assert waves == [(3, half * 2, half), (4, half * 2, half)] and status == ("completed",)


TRUST = {"id": "trust", "text": "How much do you trust the people you talk to?",
         "labels": ["not at all", "a little", "somewhat", "a lot"]}
CARS = {"id": "cars", "text": "Should cars be banned from the centre?", "options": ["yes", "no", "unsure"]}


def test_a_post_hoc_interview_of_a_recorded_opinion_run_answers_as_one_process(stack, tmp_path):
    from populace.client import InterviewRefused, interview
    from populace.core.contracts import Survey

    prepared = scenario(tmp_path, "opinion.yaml", agents=60, model={"latency_s": 0.01, "seed": 2})
    out = fleet(stack, prepared)
    assert out.status == "completed", out.reason
    survey = Survey(id="after", questions=[TRUST, CARS])
    answers = interview(out.run_id, after_round=2, survey=survey, nats=stack.url, db=stack.db)
    here = local(prepared)
    from populace.sdk.local import interview_local

    expected = asyncio.run(interview_local(here, 2, survey))
    got = answers.to_pydict()
    keys = ("agent_id", "question", "answer", "value", "raw", "valid")
    assert [tuple(got[k][i] for k in keys) for i in range(answers.num_rows)] == \
        sorted(tuple(expected[k][i] for k in keys) for i in range(len(expected["agent_id"])))
    assert answers.num_rows == 60 * 2 and set(got["after_round"]) == {2} and len(set(got["request"])) == 1
    # a sample: the same share drawn on the fleet and here
    some = interview(out.run_id, after_round=1, survey=survey, sample=0.25, nats=stack.url, db=stack.db)
    assert sorted(set(some["agent_id"].to_pylist())) == sorted(set(asyncio.run(
        interview_local(here, 1, survey, sample=0.25))["agent_id"]))
    # nothing of the run changed: its rounds and outcomes are as recorded, no round was played
    with duckdb.connect(stack.db, read_only=True) as con:
        rounds = con.execute("SELECT count(*) FROM opinion_rounds WHERE run_id = ?", [out.run_id]).fetchone()[0]
    assert rounds == prepared.config.rounds
    # bad input is refused before anything is asked, naming the flag
    for kwargs, says in (({"after_round": 9}, "--after-round: round 9 is beyond the run's last (4)"),
                         ({"after_round": 2, "agents": [3, 60]}, "--agents: agent 60 is not in the run"),
                         ({"after_round": 2, "sample": 1.5}, "--sample: 1.5 is outside (0, 1]")):
        with pytest.raises(InterviewRefused, match=says.replace("(", r"\(").replace(")", r"\)")):
            interview(out.run_id, survey=survey, nats=stack.url, **kwargs)
    with pytest.raises(InterviewRefused, match="RUN: run nope is not known"):
        interview("nope", after_round=1, survey=survey, nats=stack.url)


def test_the_orchestrator_refuses_what_it_cannot_verify(stack, tmp_path):
    """A round whose checkpoint was pruned, and a survey id the scenario plans: the orchestrator
    says why (InterviewPlaced.error), and no host is asked."""
    from populace.client import InterviewRefused, interview
    from populace.core import checkpoints
    from populace.core.contracts import Survey

    prepared = scenario(tmp_path, "vote.yaml", agents=30, interviews=PANEL[:1], model={"latency_s": 0.0, "seed": 1})
    out = fleet(stack, prepared)
    assert out.status == "completed", out.reason

    async def prune():
        nc = await bus.connect(stack.url, "e2e-prune")
        try:
            return await checkpoints.prune(nc.jetstream(), out.run_id, "last")
        finally:
            await nc.close()

    assert asyncio.run(prune()) > 0
    survey = Survey(id="later", questions=[CARS])
    with pytest.raises(InterviewRefused, match="--after-round: round 1's checkpoint cannot be used: checkpoint "
                                               f"{out.run_id}.1.agents.0 is not in the object store"):
        interview(out.run_id, after_round=1, survey=survey, nats=stack.url)
    with pytest.raises(InterviewRefused, match="survey.id: 'panel' is a survey the scenario plans"):
        interview(out.run_id, after_round=3, survey=survey.model_copy(update={"id": "panel"}), nats=stack.url)
    assert interview(out.run_id, after_round=3, survey=survey, nats=stack.url, db=stack.db).num_rows == 30


def populace(*args: str):
    """The CLI, in this process: what a subprocess would print, without importing it again each
    time (seconds on a loaded machine)."""
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from populace.cli.main import app

    res = CliRunner().invoke(app, list(args))
    return SimpleNamespace(returncode=res.exit_code, stdout=res.stdout, stderr=res.stderr or repr(res.exception))


def test_the_cli_asks_on_the_fleet_and_locally_with_identical_answers(stack, tmp_path):
    """`populace interview` of a recorded opinion run on the stack, and of the same scenario with
    --local, give the same distribution per group; `populace results --interviews` shows a
    planned panel with the interviews' LLM work apart."""
    import json

    path = example_copy(tmp_path, "opinion.yaml", agents=50, model={"latency_s": 0.0, "seed": 7})
    out = fleet(stack, prepare_file(path))
    assert out.status == "completed", out.reason
    ask = ("--after-round", "3", "--question", "Should cars be banned?", "--options", "yes,no,unsure",
           "--by", "education", "--json")
    on_fleet = populace("interview", out.run_id, *ask, "--nats", stack.url, "--db", stack.db)
    assert on_fleet.returncode == 0, on_fleet.stderr
    here = populace("interview", str(path), "--local", *ask)
    assert here.returncode == 0, here.stderr
    keys = ("group", "option", "n", "count", "share")
    rows = [{k: r[k] for k in keys} for r in json.loads(on_fleet.stdout)["rows"]]
    assert rows == [{k: r[k] for k in keys} for r in json.loads(here.stdout)["rows"]]
    assert {r["group"] for r in rows} >= {"Ph.D.", "high school"} and sum(r["count"] for r in rows) == 50
    bad = populace("interview", out.run_id, "--after-round", "9", "--question", "Why?", "--nats", stack.url)
    assert bad.returncode == 2 and "--after-round: round 9 is beyond the run's last (4)" in bad.stderr

    panel = scenario(tmp_path, "vote.yaml", agents=40, interviews=PANEL, model={"latency_s": 0.0, "seed": 3})
    voted = fleet(stack, panel)
    shown = populace("results", voted.run_id, "--interviews", "--by", "education", "--db", stack.db, "--nats",
                     stack.url)
    assert shown.returncode == 0, shown.stderr
    assert "panel/trust (likert): How much do you trust the other voters?" in shown.stdout
    assert f"{voted.run_id}: interviews: {voted.recorded.answers:,} answers" in shown.stdout
    plain = populace("results", voted.run_id, "--db", stack.db, "--nats", stack.url)
    assert "apart from the rounds' LLM work above" in plain.stdout


def test_a_budget_pauses_before_the_interviews_would_pass_it_and_a_resume_asks_them_again(stack, tmp_path):
    """20 voters, a panel of two questions every round: a round needs 20 calls and its interviews
    40. With 70 calls the run pauses after round 1 (20 used, round 2 and its interviews need
    60); without the interviews it would play on. Resumed with a larger budget, the shares
    restored from round 1's checkpoint ask round 1's interviews again (those cut short by the
    pause), and every planned answer is recorded once."""
    from populace.client.run import resume
    from populace.core.contracts import Budget

    panel = [{**PANEL[0], "sample": None}]
    prepared = scenario(tmp_path, "vote.yaml", agents=20, rounds=3, interviews=panel, budget={"llm_calls": 70},
                        model={"latency_s": 0.0, "seed": 5})
    out = fleet(stack, prepared)
    assert out.status == "paused" and "20 of 70 LLM calls used" in out.reason
    assert "needs about 60 more, 40 of them for the interviews planned after it" in out.reason

    async def go():
        nc = await bus.connect(stack.url, "e2e-interviews-resume")
        try:
            return await resume(nc, out.run_id, budget=Budget(llm_calls=1000), stall_s=120)
        finally:
            await nc.close()

    done = asyncio.run(go())
    assert done.status == "completed", done.reason
    assert done.recorded.answers == 3 * 20 * 2 and done.recorded.answers_missing == 0
    with duckdb.connect(stack.db, read_only=True) as con:
        got = con.execute("SELECT after_round, count(*), count(DISTINCT (agent_id, question)) FROM interviews "
                          "WHERE run_id = ? GROUP BY 1 ORDER BY 1", [out.run_id]).fetchall()
    assert got == [(1, 40, 40), (2, 40, 40), (3, 40, 40)]
