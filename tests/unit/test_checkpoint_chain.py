"""Incremental checkpoints, the pure parts: which agents a delta holds, when a full checkpoint
is due, how a chain resolves into every agent's state, and which objects pruning keeps."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from populace.core import subjects
from populace.core.checkpoints import Chain, CheckpointError, Stored, changed_offsets, resolve_chain, to_prune
from populace.core.settings import Settings


def stored(name: str, size: int) -> Stored:
    return Stored(name, size, "0" * 64)


def test_a_delta_holds_the_range_s_changed_agents_only_by_offset():
    assert changed_offsets(1000, 500, [1499, 3, 1000, 1200, 1500, 1200]) == [0, 200, 499]
    assert changed_offsets(0, 10, []) == []


def test_a_full_checkpoint_is_due_first_then_every_k_links_or_when_deltas_outgrow_the_base():
    chain = Chain()
    assert chain.full_due(full_every=3, delta_ratio=0.5)  # nothing to build on yet
    chain.add(stored("b", 1000), full=True)
    assert not chain.full_due(full_every=3, delta_ratio=0.5)
    chain.add(stored("d1", 100), full=False)
    assert not chain.full_due(full_every=3, delta_ratio=0.5)
    chain.add(stored("d2", 100), full=False)
    assert chain.full_due(full_every=3, delta_ratio=0.5)  # base + 2 deltas: 3 links
    assert not chain.full_due(full_every=4, delta_ratio=0.5)
    chain.add(stored("d3", 301), full=False)
    assert chain.full_due(full_every=100, delta_ratio=0.5)  # 501 bytes of deltas > half the base's 1000
    chain.add(stored("b2", 900), full=True)
    assert chain.links == [stored("b2", 900)]
    assert Chain([stored("b", 1000)]).full_due(full_every=1, delta_ratio=0.5)  # 1: every checkpoint full


def test_a_chain_resolves_to_the_base_with_each_delta_applied_in_order():
    base = {"first": 10, "count": 4, "fields": {"memory": [[], [], [], []], "__edges__": [None] * 4}}
    d1 = {"first": 10, "count": 4, "changed": [1, 3], "fields": {"memory": [[1], [3]], "__edges__": ["e1", None]}}
    d2 = {"first": 10, "count": 4, "changed": [1], "fields": {"memory": [[1, 2]], "__edges__": ["e1"]}}
    assert resolve_chain([d2, d1, base], 10, 4) == {"memory": [[], [1, 2], [], [3]], "__edges__": [None, "e1", None, None]}
    assert resolve_chain([base], 10, 4) == base["fields"]
    bad = {"first": 10, "count": 4, "changed": [0, 1], "fields": {"memory": [[1]]}}
    with pytest.raises(CheckpointError, match="1 values of 'memory' for 2 agents"):
        resolve_chain([bad, base], 10, 4)


def test_a_round_s_own_fields_come_from_the_head_only():
    """A post belongs to the round it was written in: an agent idle in the head's round has none,
    even if an older link holds one of its posts."""
    base = {"first": 0, "count": 3, "round_fields": ["__post_text__"],
            "fields": {"memory": [[], [], []], "__post_text__": ["a0", "a1", "a2"]}}
    head = {"first": 0, "count": 3, "changed": [2], "round_fields": ["__post_text__"],
            "fields": {"memory": [[9]], "__post_text__": ["b2"]}}
    assert resolve_chain([head, base], 0, 3) == {"memory": [[], [], [9]], "__post_text__": [None, None, "b2"]}
    assert resolve_chain([base], 0, 3)["__post_text__"] == ["a0", "a1", "a2"]


def test_keep_last_keeps_every_link_the_last_round_builds_on():
    names = [subjects.checkpoint_agents("r1", n, first) for n in (1, 2, 3, 4) for first in (0, 500)] + \
            [subjects.checkpoint_env("r1", n) for n in (1, 2, 3, 4)]
    a = subjects.checkpoint_agents
    # range 0: full at 2, deltas at 3 and 4; range 500: full at 4 (its deltas at 2 and 3 build on 1)
    needs = {a("r1", 4, 0): [a("r1", 2, 0), a("r1", 3, 0)], a("r1", 3, 0): [a("r1", 2, 0)],
             a("r1", 3, 500): [a("r1", 1, 500), a("r1", 2, 500)], a("r1", 2, 500): [a("r1", 1, 500)]}
    pruned = to_prune("r1", names, "last", needs)
    assert sorted(set(names) - set(pruned)) == sorted([a("r1", 2, 0), a("r1", 3, 0), a("r1", 4, 0), a("r1", 4, 500),
                                                       subjects.checkpoint_env("r1", 4)])
    assert to_prune("r1", names, "none", needs) == sorted(names)
    assert to_prune("r1", names, "all", needs) == []


def test_chain_settings_are_validated_naming_the_field():
    assert Settings().checkpoint_full_every >= 1 and Settings().checkpoint_delta_ratio > 0
    with pytest.raises(ValidationError, match="checkpoint_full_every"):
        Settings(checkpoint_full_every=0)
    with pytest.raises(ValidationError, match="checkpoint_delta_ratio"):
        Settings(checkpoint_delta_ratio=0)


def test_host_capacity_defaults_to_what_the_host_s_memory_holds_at_agent_bytes_each():
    from populace.core.settings import AGENT_BYTES, machine_memory

    assert Settings().host_capacity == machine_memory() // AGENT_BYTES
    assert Settings(host_memory_bytes=8 * 2**30).host_capacity == 8 * 2**30 // AGENT_BYTES  # 8,388,608
    assert Settings(host_capacity=5_000_000).host_capacity == 5_000_000
    with pytest.raises(ValidationError, match="host_capacity"):
        Settings(host_capacity=-1)


async def test_a_share_knows_which_agents_acted_since_its_last_checkpoint():
    from populace.client.prepare import checked
    from populace.core.contracts import RunConfig
    from populace.sdk.hosting import host_run

    resolved = checked(RunConfig.model_validate({"simulation": "vote", "agents": 10, "rounds": 2,
                                                 "model": {"backend": "dummy", "latency_s": 0.0}}))
    run = host_run(resolved, "r", [(0, 4), (6, 4)], freeze=False)
    run.acted([1])
    assert run.take_changed() is None  # nothing taken yet (the first checkpoint): everyone
    run.acted([1, 5])
    run.acted([5, 6])
    assert run.take_changed() == {1, 5, 6}
    assert run.take_changed() == set()  # an idle round: nobody
    run.agents[5].remember((1, "x"))  # agent 7: index 5, offset 1 of range (6, 4)
    parts = await run.snapshot_of({5})
    assert [(p.first, p.count, p.full, p.rows) for p in parts] == [(0, 4, False, []), (6, 4, False, [1])]
    assert [list(m) for m in parts[1].columns["memory"]] == [[(1, "x")]] and parts[0].columns["memory"] == []
    run.acted(None)  # everyone played
    assert run.take_changed() is None
    run.take_changed()
    run.restore({a.id: {"memory": []} for a in run.agents})
    assert run.take_changed() is None  # restored: the next checkpoint is full
