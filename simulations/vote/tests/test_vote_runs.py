"""Whole runs in one process (`run_local`): the same rounds on one host or three, counts that
add up to the valid answers, and the shipped example plays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from populace_vote import prompts

from populace.core import synth
from populace.core.contracts import RunConfig
from populace.population.cast import cast_from_jsonl
from populace.sdk import ScriptedLLM
from populace.sdk.local import run_local

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
OPTIONS = ["yes", "no", "undecided"]


def config(**extra) -> RunConfig:
    return RunConfig.model_validate({
        "simulation": "vote", "agents": 50, "rounds": 3, "seed": 3,
        "ballot": {"question": "Lower the voting age to 16?", "options": OPTIONS, "show_distribution": True},
        "population": {"personas": "education-50.jsonl"}, "model": {"backend": "dummy", "seed": 5}, **extra})


CAST = cast_from_jsonl((EXAMPLES / "personas" / "education-50.jsonl").read_bytes())


def mostly_valid(run, round_: int) -> ScriptedLLM:
    """The dummy model's seeded answers, except every 7th agent (shifting with the round) says
    something that is no option: invalid answers go through the whole run."""
    schema, seed = run.sim.answer_schema(), run.resolved.config.model.seed

    def answer(key: int, prompt: str) -> str:
        if (key + round_) % 7 == 0:
            return f"I'd rather not say ({key})"
        return synth.answer(schema, seed, round_, key)

    return ScriptedLLM(answer)


def without(columns: dict, *names: str) -> dict:
    return {k: v for k, v in columns.items() if k not in names}


@pytest.mark.parametrize("llm", ["dummy", "with invalid answers"])
async def test_one_host_and_three_hosts_play_identical_rounds(llm):
    kw = {} if llm == "dummy" else {"llm": mostly_valid}
    one = await run_local(config(), cast=CAST, hosts=1, **kw)
    three = await run_local(config(), cast=CAST, hosts=3, **kw)
    assert without(one.rounds, "closed_at") == without(three.rounds, "closed_at")
    assert without(one.outcomes, "latency_ms") == without(three.outcomes, "latency_ms")
    assert one.rounds["round"] == [1, 2, 3] and len(one.outcomes["agent_id"]) == 150


async def test_counts_add_up_to_the_valid_answers_and_invalid_ones_keep_their_text():
    res = await run_local(config(), cast=CAST, hosts=2, llm=mostly_valid)
    rows = res.outcomes
    for i, r in enumerate(res.rounds["round"]):
        mine = [j for j, rr in enumerate(rows["round"]) if rr == r]
        counts = res.rounds["counts"][i]
        assert list(counts) == OPTIONS
        assert sum(counts.values()) == res.rounds["n_valid"][i] == sum(rows["valid"][j] for j in mine)
        assert counts == {o: sum(rows["choice"][j] == o for j in mine) for o in OPTIONS}
        top = max(counts.values())
        assert res.rounds["leader_share"][i] == top / res.rounds["n_valid"][i]
        leaders = [o for o in OPTIONS if counts[o] == top]
        assert res.rounds["leader"][i] == (leaders[0] if len(leaders) == 1 else None)
    invalid = [j for j, v in enumerate(rows["valid"]) if not v]
    assert invalid and len(invalid) < len(rows["valid"]) // 5
    for j in invalid:
        assert rows["choice"][j] is None
        assert rows["raw"][j] == f"I'd rather not say ({rows['agent_id'][j]})"
        assert rows["error"][j] is None  # an answer that is no option is the agent's, not a failure


async def test_agents_hear_the_previous_rounds_distribution_from_round_two():
    heard: dict[int, set[str]] = {}

    def llm(run, round_: int) -> ScriptedLLM:
        def answer(key: int, prompt: str) -> str:
            start = prompt.find("In the last round")
            heard.setdefault(round_, set()).add(prompt[start:prompt.index(".", start) + 1] if start >= 0 else "")
            return json.dumps({"choice": OPTIONS[(key * round_) % 3]})
        return ScriptedLLM(answer)

    res = await run_local(config(), cast=CAST, hosts=2, llm=llm)
    assert heard[1] == {""}
    for r in (2, 3):  # every agent heard the same text: the one of the round before
        assert heard[r] == {prompts.distribution_text(res.rounds["counts"][r - 2])}


async def test_the_distribution_text_is_formatted_once_per_round_per_host(monkeypatch):
    calls: list[dict] = []
    real = prompts.distribution_text

    def counting(counts):
        calls.append(counts)
        return real(counts)

    monkeypatch.setattr(prompts, "distribution_text", counting)
    await run_local(config(), cast=CAST, hosts=3)
    assert len(calls) == 3 * 3  # 3 hosts × 3 rounds, not 50 agents × 3 rounds


async def test_a_run_without_a_population_plays_the_same_way():
    c = config(population=None, agents=30, prompt={"persona": True})
    one = await run_local(c, hosts=1)
    assert without(one.rounds, "closed_at") == without((await run_local(c, hosts=3)).rounds, "closed_at")
    assert one.rounds["n_valid"] == [30, 30, 30]


async def test_the_shipped_example_plays_locally():
    from populace.client.prepare import prepare_file

    prepared = prepare_file(EXAMPLES / "vote.yaml")
    c = prepared.config
    assert c.simulation == "vote" and c.rounds > 1 and c.population is not None
    assert prepared.resolved.params.ballot.show_distribution
    res = await run_local(prepared.resolved, cast=cast_from_jsonl(prepared.personas), hosts=2)
    assert res.rounds["n_valid"] == [c.agents] * c.rounds  # the dummy model always picks an option
    assert all(sum(counts.values()) == c.agents for counts in res.rounds["counts"])


async def test_one_agent_per_process_plays_the_same_rounds():
    # each voter turns in its own forked process; the observation and outcome cross a pipe
    c = config(population=None, agents=4, rounds=2)
    forked = await run_local(c, one_per_process=True)
    assert without(forked.rounds, "closed_at") == without((await run_local(c)).rounds, "closed_at")
