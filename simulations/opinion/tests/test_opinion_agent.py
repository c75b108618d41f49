"""The agent's turn with a scripted model and a filled inbox: what it asks, what it records,
what it posts and remembers; and a few rounds on a small graph played by hand, whose round
statistics match numpy over the graph's edges and do not depend on how agents are split."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from populace_opinion import BROADCAST, Discussant, Opinion, Say, Stance, prompts

from populace.core import synth
from populace.core.contracts import RunConfig
from populace.population.cast import cast_from_records
from populace.sdk import InferError, Message, Observation, ScriptedLLM, resolve

CAST = cast_from_records([
    {"profile": {"education": "Ph.D.", "age": 61, "gender": "female"}, "persona": {"name": "Ana Lima"}},
    {"profile": {"education": "high school", "age": 19, "gender": "male"}, "persona": {"name": "Tom Berg"}},
])
STATEMENT = "Meat should be taxed like tobacco."


class Inbox:
    """Stands in for the platform's mailbox: each agent's messages of the round."""

    def __init__(self, messages: dict[int, tuple[Message, ...]]) -> None:
        self.messages = messages

    def inbox(self, agent_id: int) -> tuple[Message, ...]:
        return self.messages.get(agent_id, ())


def sim(*, cast=CAST, agents: int = 2, **sections) -> Opinion:
    config = {"simulation": "opinion", "agents": agents, "rounds": 4, "statement": STATEMENT, **sections}
    if cast is not None:
        config["population"] = {"personas": "personas.jsonl"}  # only named: the cast is passed in
    return resolve(RunConfig.model_validate(config)).instance(cast=cast)


def discussant(s: Opinion, agent_id: int = 0) -> Discussant:
    return Discussant(agent_id, s.cast.personas[agent_id] if s.cast is not None else None, s)


def observation(round_: int, inbox: dict[int, tuple[Message, ...]] | None = None) -> Observation:
    obs = Observation(round=round_)
    if inbox is not None:
        obs._mailbox = Inbox(inbox)
    return obs


def said(author: int, stance: float, text: str = "") -> Message:
    return Message(author, Say(text=text or f"I say {stance:+.1f}.", stance=stance))


async def test_round_one_speaks_from_the_persona_and_posts():
    s = sim()
    llm = ScriptedLLM('{"stance": 0.6, "post": "Cheap meat costs us all."}')
    out = await discussant(s, 1).turn(observation(1), llm)
    assert out == Stance(stance=0.6, heard=0, heard_mean=None, raw='{"stance": 0.6, "post": "Cheap meat costs us all."}',
                         valid=True, post=Say(text="Cheap meat costs us all.", stance=0.6))
    asked = llm.asked[0]
    persona = CAST.personas[1].text
    assert asked.prompt == f"{persona}\nWhat is your stance now, and what do you post?"
    assert (asked.key, asked.prefix_chars) == (1, len(persona))  # the persona is the cacheable prefix
    assert f'"{STATEMENT}"' in s.system_prompt() and prompts.SPEAK_AS_PERSONA in s.system_prompt()
    assert s.answer_schema() == prompts.answer_schema("direct")


async def test_without_persona_the_prompt_has_none():
    for s in (sim(prompt={"persona": False}), sim(cast=None)):
        llm = ScriptedLLM('{"stance": 0, "post": "Hm."}')
        await discussant(s).turn(observation(1), llm)
        assert llm.asked[0].prompt == "What is your stance now, and what do you post?"
        assert llm.asked[0].prefix_chars == 0 and prompts.SPEAK_AS_PERSONA not in s.system_prompt()


async def test_it_reads_its_inbox_and_records_what_it_heard():
    s = sim(cast=None)
    agent = discussant(s)
    agent.remember((1, -0.2))
    inbox = {0: (said(4, -0.5, "Leave my plate alone."), said(9, 0.25),
                 Message(BROADCAST, Say(text="Meat tax now!", stance=1.0)))}
    llm = ScriptedLLM('{"stance": 0.1, "post": "Maybe a small tax."}')
    out = await agent.turn(observation(2, inbox), llm)
    assert (out.stance, out.heard, out.heard_mean) == (0.1, 3, -0.125)  # the broadcast is heard, not averaged
    assert (out.listened.n, out.listened.total) == (2, -250_000)
    assert llm.asked[0].prompt == (
        "Your stance in round 1 was -0.20.\n"
        "Sent to many people at once, not by someone you follow:\n"
        '- "Meat tax now!" (stance +1.00)\n'
        "Posts of people you follow, from the last round:\n"
        '- "Leave my plate alone." (stance -0.50)\n'
        '- "I say +0.2." (stance +0.25)\n'
        "What is your stance now, and what do you post?")
    assert agent.memory == ((2, 0.1),)


async def test_at_most_max_posts_are_read_but_all_are_heard():
    s = sim(cast=None, agents=40, prompt={"max_posts": 3})
    inbox = {5: tuple(said(a, 0.5) for a in range(20))}
    llm = ScriptedLLM('{"stance": 0.5, "post": "Agreed."}')
    out = await discussant(s, 5).turn(observation(2, inbox), llm)
    assert out.heard == 20 and out.heard_mean == 0.5
    assert llm.asked[0].prompt.count("\n- ") == 3 and "(3 of the 20 you heard)" in llm.asked[0].prompt


@pytest.mark.parametrize("raw", ['{"stance": 1.5, "post": "Way up."}', '{"stance": 0.5}', "I agree.", ""])
async def test_an_invalid_answer_keeps_its_text_posts_nothing_and_is_not_remembered(raw):
    s = sim(cast=None)
    agent = discussant(s)
    agent.remember((1, 0.3))
    out = await agent.turn(observation(2, {0: (said(1, 0.5),)}), ScriptedLLM(raw))
    assert out == Stance(stance=None, heard=1, heard_mean=0.5, raw=raw, valid=False, post=None)
    assert agent.memory == ((1, 0.3),)  # its last stance is still the one it gave


async def test_its_last_stance_survives_a_checkpoint_through_json():
    s = sim(cast=None)
    agent = discussant(s)
    await agent.turn(observation(1), ScriptedLLM('{"stance": -0.35, "post": "No."}'))
    restored = discussant(s)
    restored.restore(json.loads(json.dumps(agent.state())))
    llm = ScriptedLLM('{"stance": 0, "post": "Hm."}')
    await restored.turn(observation(2), llm)
    assert llm.asked[0].prompt.startswith("Your stance in round 1 was -0.35.")


async def test_no_model_is_not_an_answer():
    with pytest.raises(InferError):  # the platform records an infrastructure failure, never a stance
        await discussant(sim()).turn(observation(1), ScriptedLLM({0: InferError("no replica")}))


async def test_chain_of_thought_reasons_first():
    s = sim(prompt={"answer": "cot"})
    llm = ScriptedLLM('{"reasoning": "I eat little meat.", "stance": 0.4, "post": "Tax it."}')
    out = await discussant(s).turn(observation(1), llm)
    assert out.stance == 0.4 and llm.asked[0].prompt.endswith("Think step by step, then give your stance and your post.")
    assert list(s.answer_schema()["properties"]) == ["reasoning", "stance", "post"]


async def test_the_manifests_user_example_is_agent_zeros_first_prompt():
    s = sim()
    llm = ScriptedLLM('{"stance": 0, "post": "Hm."}')
    await discussant(s).turn(observation(1), llm)
    assert s.user_example() == llm.asked[0].prompt


async def test_the_dummy_models_answer_is_valid():
    s = sim(cast=None)
    raw = synth.answer(s.answer_schema(), 1, 1, 0)
    out = await discussant(s).turn(observation(1), ScriptedLLM(raw))
    assert out.valid and out.stance in (-1.0, 0.0, 1.0)


def test_a_discussant_is_a_small_object():
    assert not hasattr(discussant(sim()), "__dict__")


# --- a few rounds on a small graph, played by hand ---------------------------------------------

N = 30


def in_neighbours(seed: int = 0) -> dict[int, list[int]]:
    rng = random.Random(seed)
    return {v: sorted(rng.sample([u for u in range(N) if u != v], 4)) for v in range(N)}


def drifting(key: int, prompt: str) -> str:
    """Moves towards the mean of what it read; every 9th agent answers garbage."""
    if key % 9 == 4:
        return "no comment"
    heard = [float(p.split("(stance ")[1].rstrip(")")) for p in prompt.split("\n") if "(stance " in p]
    start = (key % 7) / 3 - 1
    stance = round(start if not heard else 0.5 * start + 0.5 * sum(heard) / len(heard), 4)
    return json.dumps({"stance": stance, "post": f"Agent {key} says {stance}."})


async def play_rounds(hosts: list[range], rounds: int = 3):
    """Every round: each agent's inbox is its in-neighbours' posts of the round before; each
    'host' reduces its own agents, the hosts' partials are merged in reverse order."""
    s = sim(cast=None, agents=N)
    env = type(s).Env(s)
    graph = in_neighbours()
    agents = [discussant(s, i) for i in range(N)]
    posts: dict[int, Say] = {}
    history = []
    for r in range(1, rounds + 1):
        inbox = {v: tuple(Message(u, posts[u]) for u in graph[v] if u in posts) for v in range(N)}
        if r == 2:
            inbox[0] = (*inbox[0], Message(BROADCAST, Say(text="Tax it!", stance=1.0)))
        obs = observation(r, inbox)
        llm = ScriptedLLM(drifting)
        outs = [await a.turn(obs, llm) for a in agents]
        partials = [env.reduce(list(h), [outs[i] for i in h]) for h in hosts]
        _, summary = env.decide(env.start(), r, env.merge(partials[::-1]))
        history.append((outs, dict(posts), summary))
        posts = {i: o.post for i, o in enumerate(outs) if o.post is not None}
    return graph, history


async def test_rounds_on_a_graph_match_numpy_over_its_edges_on_any_split():
    graph, one = await play_rounds([range(N)])
    _, three = await play_rounds([range(7), range(7, 20), range(20, N)])
    assert [h[2] for h in one] == [h[2] for h in three]
    for r, (outs, previous, summary) in enumerate(one, start=1):
        valid = np.array([o.stance for o in outs if o.valid])
        assert summary.mean_stance == pytest.approx(valid.mean(), abs=1e-12)
        assert summary.var_stance == pytest.approx(valid.var(), abs=1e-12)
        pairs = [(outs[v].stance, previous[u].stance) for v in range(N) for u in graph[v]
                 if outs[v].valid and u in previous]
        for v in range(N):
            mine = [previous[u].stance for u in graph[v] if u in previous]
            assert outs[v].heard == len(mine) + (r == 2 and v == 0)  # the broadcast is heard ...
            assert outs[v].heard_mean == (pytest.approx(np.mean(mine), abs=1e-12) if mine else None)  # ... not averaged
        if r == 1:
            assert not pairs and summary.assortativity is None
        else:
            xs, ys = zip(*pairs, strict=True)
            assert summary.assortativity == pytest.approx(np.corrcoef(xs, ys)[0, 1], abs=1e-12)
    assert sum(not o.valid for o in one[0][0]) == len(range(4, N, 9))
