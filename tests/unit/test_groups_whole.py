"""A group travels whole: the outcome sink lets a batch leave only between groups — a scene's acts
and lines with every one of its members' outcomes, whatever the batch size or the scene's text,
for nested groups too — a group too large for any message pauses its round naming it, and the
agent-host cuts a message past NATS' max_payload between groups only (populace.agent_host.batch_fit).
The recorder refuses an act that is not beside its member's outcome (populace.store.columns):
these tests check each batch as it does."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from populace.agent_host.batch_fit import BatchTooLarge, fit, halves
from populace.agent_host.publisher import _act_columns
from populace.core.contracts import ActColumns, LineColumns, OutcomeBatch, RunConfig
from populace.sdk import Agent, Env, GroupEnv, Outcome, Partial, ScriptedLLM, Simulation, State, Summary
from populace.sdk import play as play_mod
from populace.sdk.hosting import host_run
from populace.sdk.local import run_local
from populace.sdk.play import OutcomeRows, OutcomeSink, SceneFailed
from populace.sdk.registry import resolve
from populace.store.columns import check_outcomes

HERE = __name__


class Said(Outcome):
    value: int | None = None
    measure = "value"


class Words(Outcome):
    n: int | None = None


class Count(Partial):
    n: int = 0


class Mean(Summary):
    members: int = 0


class Counting(Env[State, Count]):
    Partial = Count

    def reduce(self, agent_ids, outcomes):
        return Count(n=len(outcomes))

    def merge(self, partials):
        return Count(n=sum(p.n for p in partials))

    def decide(self, state, round, total):
        return state, Mean(members=total.n)


class Speaker(Agent):
    __slots__ = ()

    async def act(self, phase, view, llm):
        raw = await llm.ask(f"{phase} {view}", key=self.id)
        return Words(n=len(raw), raw=raw)


class Talk(GroupEnv):
    """Each member speaks twice, every act a line; the scene closes with a line of its own."""

    async def scene(self, scene):
        for i, m in enumerate((*scene.members, *scene.members)):
            act = await m.act("speak", i)
            scene.say(m, act.raw, n=act.n)
        scene.say(None, f"group {scene.group} is done")
        for m in scene.members:
            scene.outcome(m, Said(value=len(scene.members), raw=f"member of {scene.group}"))
        return None


class Talks(Simulation):
    name = "talks"
    Agent = Speaker
    Env = Counting
    GroupEnv = Talk
    Act = Words
    Outcome = Said
    Summary = Mean

    def group_size(self):
        return 3  # odd, beside a batch size of 2: a batch cut by count alone would split groups


class Desk(GroupEnv):
    level = "desk"

    def settle(self, round, group, agent_ids, outcomes):
        return None


class NestedTalk(Talk):
    Parent = Desk


class NestedTalks(Talks):
    name = "nested-talks"
    GroupEnv = NestedTalk

    def group_sizes(self):
        return 3, 9


def long_answers(chars: int) -> ScriptedLLM:
    return ScriptedLLM(lambda key, prompt: f"agent {key} says " + "x" * chars)


def share(sim: str, agents: int):
    resolved = resolve(RunConfig(simulation=f"{HERE}:{sim}", agents=agents, rounds=1))
    return host_run(resolved, "r", [(0, agents)], freeze=False)


async def play(run, llm, batch_size: int) -> tuple[list[OutcomeRows], OutcomeSink]:
    batches: list[OutcomeRows] = []
    sink = OutcomeSink(type(run.sim), run.env, batch_size=batch_size, emit=batches.append, grouped=True,
                       levels=run.player.level_names)
    await run.player.play(run.observation(1, None), llm, sink)
    return batches, sink


def assert_whole(batches: list[OutcomeRows], sizes: dict[int, int]) -> None:
    """Every group in exactly one batch with all its members, its acts and lines beside them."""
    seen: set[int] = set()
    for b in batches:
        members = Counter(b.group_ids)
        assert all(members[g] == sizes[g] for g in members), (members, b.seq)
        assert not seen & set(members), "a group in two batches"
        seen |= set(members)
        group_of = dict(zip(b.agent_ids, b.group_ids))
        acts = b.acts or {"group_id": [], "agent_id": []}
        assert all(group_of.get(a) == g for g, a in zip(acts["group_id"], acts["agent_id"]))
        lines = b.lines or {"group_id": [], "speaker": []}
        assert all(g in members and (s == -1 or group_of.get(s) == g)
                   for g, s in zip(lines["group_id"], lines["speaker"]))
        assert Counter(acts["group_id"]) == {g: 2 * k for g, k in members.items()}  # every act of each group
        assert Counter(lines["group_id"]) == {g: 2 * k + 1 for g, k in members.items()}
    assert seen == set(sizes)


@pytest.mark.parametrize("sim, agents", [("Talks", 20), ("NestedTalks", 20)])
async def test_a_batch_leaves_only_between_groups_whatever_its_size_and_the_scenes_text(sim, agents, monkeypatch):
    monkeypatch.setattr(play_mod, "SCENE_BYTES", 6_000)  # about one group's text: most batches leave on bytes
    run = share(sim, agents)
    sizes = Counter(m // 3 for m in range(agents))  # the last group is smaller, never dropped
    batches, sink = await play(run, long_answers(900), batch_size=2)
    assert sink.close().n == agents
    assert len(batches) >= 5
    assert_whole(batches, dict(sizes))
    if sim == "NestedTalks":  # each row keeps its outer level's id
        assert [d for b in batches for d in b.levels["desk"]] == [g // 3 for b in batches for g in b.group_ids]
    # and the recorder, checking each batch as it does, refuses no group of them
    tables = run.tables
    for b in batches:
        wire = OutcomeBatch(run_id="r", round=1, host_id="h", seq=b.seq, agent_ids=b.agent_ids, columns=b.columns,
                            valid=b.valid, raws=b.raws, latency_ms=b.latency_ms, errors=b.errors,
                            group_ids=b.group_ids, levels=b.levels, acts=ActColumns(**_act_columns(b.acts)),
                            lines=LineColumns(**b.lines))
        assert check_outcomes(wire, tables)[1] == []


async def test_a_batch_leaves_before_a_group_that_would_take_it_past_its_size(monkeypatch):
    monkeypatch.setattr(play_mod, "SCENE_BYTES", 10_000)
    run = share("Talks", 12)
    batches, sink = await play(run, long_answers(1_000), batch_size=1000)  # a group: ~7 KB of text
    sink.close()
    assert [len(b.agent_ids) for b in batches] == [3, 3, 3, 3]  # never two groups past 10 KB


def test_a_group_too_large_for_a_message_pauses_its_round_naming_it(monkeypatch):
    monkeypatch.setattr(play_mod, "GROUP_BYTES", 5_000)
    config = RunConfig(simulation=f"{HERE}:Talks", agents=6, rounds=1)
    with pytest.raises(SceneFailed, match=r"^simulation 'talks', round 1, group \d: its acts, lines and answers are "
                                          r"[\d,]+ bytes, more than one message carries \(5,000\)"):
        asyncio.run(run_local(config, llm=lambda run, n: long_answers(1_000)))
    asyncio.run(run_local(config, llm=lambda run, n: long_answers(100)))  # a small one travels


# -- the agent-host's cut of an oversize message --------------------------------------------------
def batch(groups: list[int], text: int = 100) -> OutcomeBatch:
    """Agents 0.. in the given groups (rows of a group together), one act and one line each."""
    n = len(groups)
    return OutcomeBatch(
        run_id="r", round=2, host_id="host-0", seq=7, agent_ids=list(range(n)), columns={"value": list(range(n))},
        valid=[True] * n, raws=["a" * text] * n, latency_ms=[1.0] * n, errors=[None] * n, group_ids=groups,
        acts=ActColumns(group_id=groups, seq=[0] * n, agent_id=list(range(n)), phase=["speak"] * n,
                        columns={"n": [1] * n}, valid=[True] * n, raw=["b" * text] * n, latency_ms=[1.0] * n,
                        error=[None] * n),
        lines=LineColumns(group_id=groups, seq=[1] * n, speaker=list(range(n)), text=["c" * text] * n,
                          fields=[None] * n))


def test_a_message_that_fits_is_sent_as_it_is():
    b = batch([0, 0, 1, 1])
    assert fit(b, 1_000_000) == [("", b.model_dump_json().encode())]


def test_an_oversize_message_is_cut_between_groups_until_each_piece_fits():
    groups = [0, 0, 0, 1, 1, 2, 3, 3, 3, 3, 4]
    b = batch(groups, text=2_000)
    pieces = fit(b, 30_000)
    assert len(pieces) > 2 and all(len(data) <= 30_000 for _, data in pieces)
    assert len({suffix for suffix, _ in pieces}) == len(pieces)  # each its own message id
    parts = [OutcomeBatch.model_validate_json(data) for _, data in pieces]
    assert [a for p in parts for a in p.agent_ids] == b.agent_ids
    for p in parts:  # whole groups, each with its acts and lines
        assert Counter(p.group_ids) == {g: groups.count(g) for g in set(p.group_ids)}
        assert p.acts.agent_id == p.agent_ids and p.lines.speaker == p.agent_ids
    assert fit(b, 30_000) == pieces  # played again, cut the same way: the same message ids


def test_halves_cut_at_the_group_boundary_nearest_the_middle_and_never_inside_a_group():
    left, right = halves(batch([0, 1, 1, 1, 1, 2]))
    assert (left.group_ids, right.group_ids) == ([0], [1, 1, 1, 1, 2])
    assert halves(batch([5, 5, 5])) is None


def test_one_group_larger_than_a_message_pauses_the_round_naming_it():
    with pytest.raises(BatchTooLarge, match=r"round 2: group 1 of host-0 takes [\d,]+ bytes as a message"):
        fit(batch([0, 1, 1, 1], text=5_000), 20_000)
