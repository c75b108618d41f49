"""Snapshot semantics, for every built-in simulation (and the dictator template): a run with
interviews planned after every round (a panel: four kinds of question asked each in its own
call, and a survey asked together of a seeded half) gives exactly the outcome, round, post, act,
transcript and edge rows of the same run without them, and its LLM calls differ by exactly the
interviews' calls. And what an agent does while it answers is never remembered."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from populace_vote import Vote, Voter

from populace.client.prepare import prepare_file
from populace.graph.serial import loads
from populace.population.cast import cast_from_jsonl
from populace.sdk.local import dummy_llm, interview_local, run_local

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DICTATOR = EXAMPLES / "simulations" / "dictator"

CASES = {
    "ratio-game": ("guess-two-thirds.yaml", {"agents": 60}, {}),
    "public-goods": ("public-goods.yaml", {"agents": 43, "rounds": 3}, {"hosts": 3}),
    "public-goods-per-process": ("public-goods.yaml", {"agents": 8, "rounds": 2}, {"hosts": 2, "one_per_process": True}),
    "vote": ("vote.yaml", {"agents": 50}, {"hosts": 2}),
    "opinion": ("opinion.yaml", {"agents": 60}, {"hosts": 3}),
    "ultimatum": ("ultimatum.yaml", {"agents": 40}, {}),
    "bargaining": ("bargaining.yaml", {"agents": 40}, {}),
    "punishment": ("punishment.yaml", {"agents": 42, "game": {"block": 20}}, {"hosts": 2}),  # a pair in the last block
    "schelling": ("schelling.yaml", {"agents": 150, "rounds": 3, "grid": {"width": 15, "height": 15, "torus": True,
                                                                          "kinds": 2}}, {"hosts": 2}),
    "schelling-llm": ("schelling.yaml", {"agents": 100, "rounds": 2, "grid": {"width": 12, "height": 12, "torus": True,
                                                                              "kinds": 2},
                                         "rule": {"threshold": 0.3, "decider": "llm"}}, {}),
    # endowments of 13 or more against a metabolism of at most 4: nobody starves in 3 rounds (the
    # counts below take a fixed population); the model picks among the cells in sight
    "sugarscape": ("sugarscape.yaml", {"agents": 60, "rounds": 3, "grid": {"width": 15, "height": 15},
                                       "traits": {"endowment": [13, 25]}, "rule": {"decider": "llm"}},
                   {"hosts": 2}),
    "feed": ("feed.yaml", {"agents": 40, "rounds": 3, "pool": {"size": 100, "seed_posts": 20}}, {"hosts": 2}),
    "dictator": ("simulations/dictator/scenario.yaml", {"agents": 30, "simulation": "dictator_game:DictatorGame"},
                 {"hosts": 2}),
}
QUESTIONS = [
    {"id": "trust", "text": "How much do you trust the people you played with?",
     "labels": ["not at all", "a little", "somewhat", "a lot", "completely"]},
    {"id": "again", "text": "Would you play again?", "options": ["yes", "no", "not sure"]},
    {"id": "fair", "text": "How fair was the last round, from 0 to 10?", "min": 0, "max": 10, "integer": True},
    {"id": "why", "text": "In one sentence, why did you play as you did?", "max_chars": 200},
]
PANEL = [{"id": "panel", "after": "every", "questions": QUESTIONS},
         {"id": "together", "after": "every", "mode": "together", "sample": 0.5, "questions": QUESTIONS[:2]}]
DROPPED = ("latency_ms", "closed_at")


@pytest.fixture(scope="module", autouse=True)
def dictator_importable():
    sys.path.insert(0, str(DICTATOR))
    yield
    sys.path.remove(str(DICTATOR))


def prepared(case: str, extra: dict):
    scenario, overrides, options = CASES[case]
    path = EXAMPLES / scenario
    data = {**yaml.safe_load(path.read_text()), **overrides, **extra}
    # beside the original (relative paths resolve the same), under a name of its own: two runs of
    # this test at once (two sessions on one tree, a loaded machine) shared one fixed name, and the
    # first to finish deleted the other's file before it was read (FileNotFoundError on unlink)
    fd, name = tempfile.mkstemp(prefix=f".interview-{case}-", suffix=".yaml", dir=path.parent)
    scratch = Path(name)
    with os.fdopen(fd, "w") as f:
        f.write(yaml.safe_dump(data))
    try:
        return prepare_file(scratch), options
    finally:
        scratch.unlink()


class Counting:
    """The dummy model's ports, counted: every call of every round's and interview's port."""

    def __init__(self) -> None:
        self.ports = []

    def __call__(self, run, round_):
        port = dummy_llm(run, round_)
        self.ports.append(port)
        return port

    @property
    def calls(self) -> int:
        return sum(p.calls for p in self.ports)


def play(case: str, extra: dict):
    prep, options = prepared(case, extra)
    cast = cast_from_jsonl(prep.personas) if prep.personas is not None else None
    graph = loads(prep.graph) if prep.graph is not None else None
    counting = Counting()
    result = asyncio.run(run_local(prep.resolved, cast=cast, graph=graph, llm=counting, **options))
    return result, counting.calls


def rows(result) -> dict:
    tables = {"outcomes": result.outcomes, "rounds": result.rounds, "posts": result.posts, "acts": result.acts,
              "transcripts": result.transcripts, "edges": result.edges}
    return {name: {k: v for k, v in cols.items() if k not in DROPPED} for name, cols in tables.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_interviews_never_change_the_run(case):
    plain, plain_calls = play(case, {})
    asked, asked_calls = play(case, {"interviews": PANEL})
    assert rows(asked) == rows(plain)
    t = asked.interviews
    rounds = asked.config.rounds
    agents = asked.config.agents
    each = sum(1 for s in t["survey"] if s == "panel")
    together = sum(1 for s in t["survey"] if s == "together")
    assert each == rounds * agents * len(QUESTIONS)  # every agent, every round, every question
    assert 0 < together < rounds * agents * 2  # a seeded half, the same agents every round
    by_round = {r: sorted({a for a, s, rr in zip(t["agent_id"], t["survey"], t["after_round"])
                           if s == "together" and rr == r}) for r in range(1, rounds + 1)}
    assert all(ids == by_round[1] for ids in by_round.values())
    assert all(t["valid"])
    # one call per question asked alone, one per agent for the survey asked together
    assert asked_calls - plain_calls == each + together // 2 == asked.interview_calls


@pytest.mark.parametrize("case", ["vote", "opinion", "public-goods"])
def test_post_hoc_answers_equal_planned_ones(case):
    """Asked after the fact from the state the run kept, an agent gives the answer it gave when
    the scenario planned the question: the seeds are (run seed, round, agent, question)."""
    asked, _ = play(case, {"interviews": PANEL})
    plan = asked.config.interviews[0]
    later = asyncio.run(interview_local(asked, 2, plan.survey))
    t = asked.interviews
    planned = [(a, q, x) for a, q, x, s, r in zip(t["agent_id"], t["question"], t["answer"], t["survey"],
                                                   t["after_round"]) if s == "panel" and r == 2]
    assert list(zip(later["agent_id"], later["question"], later["answer"])) == planned
    one = asyncio.run(interview_local(asked, 2, plan.survey.model_copy(update={"questions": plan.questions[1:2]})))
    assert one["answer"] == [x for a, q, x in planned if q == "again"]  # asked alone: the same answers


class Forgetful(Voter):
    """An agent whose answer tries to change it: it remembers being asked, and raises for agent 3."""

    __slots__ = ()

    async def answer(self, asked, llm):
        self.remember(("interviewed", asked.id))
        if self.id == 3:
            raise RuntimeError("agent 3 will not say")
        return await super().answer(asked, llm)


class ForgetfulVote(Vote):
    name = "forgetful-vote"
    Agent = Forgetful


def test_what_an_agent_does_while_answering_is_not_remembered():
    from populace.core.contracts import RunConfig

    config = {"simulation": f"{__name__}:ForgetfulVote", "agents": 12, "rounds": 3, "seed": 4}
    plain = asyncio.run(run_local(RunConfig(**config)))
    asked = asyncio.run(run_local(RunConfig(**config, interviews=PANEL[:1])))
    assert rows(asked) == rows(plain)
    t = asked.interviews
    failed = [i for i, a in enumerate(t["agent_id"]) if a == 3]
    assert failed and not any(t["valid"][i] for i in failed)
    assert t["error"][failed[0]] == "agent: RuntimeError: agent 3 will not say"
    assert t["raw"][failed[0]] == "<agent error: RuntimeError: agent 3 will not say>"
    assert all(v for i, v in enumerate(t["valid"]) if i not in failed)
