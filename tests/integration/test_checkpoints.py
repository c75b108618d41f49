"""Checkpoints on a real object store: each object is read only as its expected writer stored
it (metadata under another writer's token is never looked at) and against the digest its writer
reported; every read has a deadline and a bound on size; what one writer stores for one run, and
the store as a whole, are bounded by the server; what belongs to no run is swept."""

from __future__ import annotations

import time

import nats
import pytest
from pydantic_core import to_json

from populace.core import bus, checkpoints, owned_objects, subjects
from populace.core.contracts import Layout, RunConfig, RunState, Share, StoredObject
from populace.core.natsserver import EmbeddedNats

pytestmark = pytest.mark.integration


async def forge_meta(js, name: str, writer: str, meta: StoredObject) -> None:
    """Publish `meta` as `writer`'s newest metadata of `name` (what `writer`'s credentials may do)."""
    await js.publish(owned_objects.meta_subject(writer, name), to_json(meta))


async def test_a_checkpoint_is_read_only_if_it_still_has_the_digest_its_writer_reported(js):
    stored = await checkpoints.save_agents(js, "run-a", 1, 0, 2, {"memory": [[1], [2]]}, writer="h0")
    env = await checkpoints.save_env(js, "run-a", 1, {"winners": [3.0]}, {"history": [3.0]})
    assert stored.name == subjects.checkpoint_agents("run-a", 1, 0) and stored.size > 0
    digests, writers = {stored.name: stored.digest, env.name: env.digest}, {stored.name: "h0"}
    assert await checkpoints.load_agents(js, "run-a", 1, [(0, 2)], [(0, 2)], digests, writers) == {
        0: {"memory": [1]}, 1: {"memory": [2]}}
    assert await checkpoints.load_env(js, "run-a", 1, digests) == ({"winners": [3.0]}, {"history": [3.0]}, None, None,
                                                                   None, None)

    # the writer itself writes both names again (a round played again, or a placed host spoiling
    # its own): the version with the recorded digest is read while it is there …
    await checkpoints.save_agents(js, "run-a", 1, 0, 2, {"memory": [[99], [99]]}, writer="h0")
    await checkpoints.save_env(js, "run-a", 1, {"winners": [0.0]}, {"history": [0.0]})
    spoiled = await owned_objects.read_meta(js, stored.name, "h0")
    await forge_meta(js, stored.name, "h0", spoiled.model_copy(update={"sha256": stored.digest}))  # says it, is not
    assert await checkpoints.load_agents(js, "run-a", 1, [(0, 2)], [(1, 1)], digests, writers) == {
        1: {"memory": [2]}}
    assert (await checkpoints.load_env(js, "run-a", 1, digests)).state == {"winners": [3.0]}
    # … and once only the newest is left, it is refused by its digest, naming the object
    for name, writer in ((stored.name, "h0"), (env.name, checkpoints.ENV_WRITER)):
        await js.purge_stream(subjects.CHECKPOINTS_STREAM, subject=owned_objects.meta_subject(writer, name), keep=1)
    await owned_objects.write_object(js, stored.name, to_json({"first": 0, "count": 2, "fields": {"memory": [[9], [9]]}}),
                                     "h0")
    with pytest.raises(checkpoints.CheckpointUnverified,
                       match=r"checkpoint run-a\.1\.agents\.0 was changed after its writer stored it"):
        await checkpoints.load_agents(js, "run-a", 1, [(0, 2)], [(1, 1)], digests, writers)
    with pytest.raises(checkpoints.CheckpointUnverified, match=r"checkpoint run-a\.1\.env was changed"):
        await checkpoints.load_env(js, "run-a", 1, digests)


async def test_objects_another_writer_stores_under_the_same_name_are_never_read(js):
    """Issue 41, attack 1: any host could publish a name's newest metadata, and readers took the
    newest. Another writer's objects under the same names (a host's, forging the environment's
    state, a world, a config and another host's agents) change nothing a reader reads."""
    agents = await checkpoints.save_agents(js, "run-f", 1, 0, 2, {"memory": [[1], [2]]}, writer="h0")
    env = await checkpoints.save_env(js, "run-f", 1, {"s": 1}, {"o": 1})
    world = await checkpoints.save_world(js, "run-f", 1, b"arrow bytes", writer=checkpoints.ENV_WRITER)
    config = await checkpoints.put_bytes(js, subjects.checkpoint_config("run-f", 1, "c" * 64), b"{}",
                                         writer=checkpoints.CONFIG_WRITER)
    for name in (agents.name, env.name, world.name, subjects.checkpoint_config("run-f", 1, "c" * 64)):
        await owned_objects.write_object(js, name, b'{"forged": true}', "h9")
    digests = {agents.name: agents.digest, env.name: env.digest}
    assert await checkpoints.load_agents(js, "run-f", 1, [(0, 2)], [(0, 2)], digests, {agents.name: "h0"}) == {
        0: {"memory": [1]}, 1: {"memory": [2]}}
    assert (await checkpoints.load_env(js, "run-f", 1, digests)).state == {"s": 1}
    assert await checkpoints.load_world(js, world) == b"arrow bytes"
    assert await checkpoints.get_bytes(js, subjects.checkpoint_config("run-f", 1, "c" * 64), config) == b"{}"
    # a reader that does not know an agents' object's writer uses none
    with pytest.raises(checkpoints.CheckpointUnverified, match="has no writer recorded"):
        await checkpoints.load_agents(js, "run-f", 1, [(0, 2)], [(0, 2)], digests, {})
    # a partial is its own share's host's
    partial = subjects.checkpoint_partial("run-f", 1, "h1@3")
    digest = await checkpoints.put_bytes(js, partial, b"[1, 2]", writer="h1")
    await owned_objects.write_object(js, partial, b"[9]", "h9")
    assert checkpoints.writer_of(partial) == "h1"
    assert await checkpoints.get_bytes(js, partial, digest) == b"[1, 2]"


async def test_a_read_of_metadata_pointing_at_nothing_or_at_more_fails_at_once_and_names_the_object(js):
    """Metadata (its writer's own: nobody else's is read) whose chunks hold nothing, fewer or more
    than it says, or more than the reader takes: a named error at once, never a wait."""
    good = await owned_objects.write_object(js, "run-d.1.env", b"x" * 300_000, checkpoints.ENV_WRITER)
    other = await owned_objects.write_object(js, "run-d.1.world", b"y" * 10, checkpoints.ENV_WRITER)
    cases = {
        "nothing": good.model_copy(update={"first_seq": other.last_seq + 10, "last_seq": other.last_seq + 12}),
        "fewer": good.model_copy(update={"size": 500_000, "chunks": 4, "last_seq": good.last_seq + 1}),
        "more": good.model_copy(update={"size": 200_000, "chunks": 2}),
        "others": good.model_copy(update={"first_seq": other.first_seq, "last_seq": other.first_seq + 2}),
    }
    for why, meta in cases.items():
        await forge_meta(js, "run-d.1.env", checkpoints.ENV_WRITER, meta)
        t0 = time.monotonic()
        with pytest.raises(owned_objects.CheckpointUnavailable, match=r"checkpoint run-d\.1\.env by environment"):
            await owned_objects.read_object(js, "run-d.1.env", checkpoints.ENV_WRITER)
        assert time.monotonic() - t0 < 2.0, why
    await forge_meta(js, "run-d.1.env", checkpoints.ENV_WRITER, good)
    assert await owned_objects.read_object(js, "run-d.1.env", checkpoints.ENV_WRITER) == b"x" * 300_000
    with pytest.raises(checkpoints.CheckpointError, match="holds 300,000 bytes, more than the 1,000 its reader takes"):
        await checkpoints.get_bytes(js, "run-d.1.env", good.sha256, max_bytes=1000)
    await js.publish(owned_objects.meta_subject(checkpoints.ENV_WRITER, "run-d.1.env"), b"not json")
    with pytest.raises(checkpoints.CheckpointError, match="its metadata by environment is malformed"):
        await owned_objects.read_object(js, "run-d.1.env", checkpoints.ENV_WRITER)
    with pytest.raises(checkpoints.CheckpointMissing, match=r"checkpoint run-d\.2\.env by environment is not in"):
        await owned_objects.read_object(js, "run-d.2.env", checkpoints.ENV_WRITER)


async def test_a_delta_chain_restores_every_agent_and_refuses_a_forged_or_missing_link(js):
    """A base and two deltas (agents that acted only) restore to exactly the full state; a link
    rewritten by its writer, or gone, stops the restore naming it; one stored by another writer
    under its name changes nothing."""
    chain = checkpoints.Chain()
    base = await checkpoints.save_agents(js, "run-c", 1, 0, 3, {"memory": [[1], [1], [1]]}, writer="h0")
    chain.add(base, full=True)
    d2 = await checkpoints.save_agents(js, "run-c", 2, 0, 3, {"memory": [[1, 2]]}, writer="h0", changed=[1],
                                       chain=chain)
    chain.add(d2, full=False)
    d3 = await checkpoints.save_agents(js, "run-c", 3, 0, 3, {"memory": [[1, 3], [1, 2, 3]]}, writer="h0",
                                       changed=[0, 1], chain=chain)
    writers = {d3.name: "h0", d2.name: "h0"}
    assert await checkpoints.load_agents(js, "run-c", 3, [(0, 3)], [(0, 3)], {d3.name: d3.digest}, writers) == {
        0: {"memory": [1, 3]}, 1: {"memory": [1, 2, 3]}, 2: {"memory": [1]}}
    assert await checkpoints.load_agents(js, "run-c", 2, [(0, 3)], [(2, 1)], {d2.name: d2.digest}, writers) == {
        2: {"memory": [1]}}
    await checkpoints.present(js, [d3.name], writers)  # its links are there too

    await checkpoints.save_agents(js, "run-c", 1, 0, 3, {"memory": [[7], [7], [7]]}, writer="h9")
    assert (await checkpoints.load_agents(js, "run-c", 3, [(0, 3)], [(0, 3)], {d3.name: d3.digest}, writers))[2] == {
        "memory": [1]}
    # the base rewritten by its writer, its first version gone: the delta's own digest still
    # matches, its base does not
    await checkpoints.save_agents(js, "run-c", 1, 0, 3, {"memory": [[7], [7], [7]]}, writer="h0")
    await js.purge_stream(subjects.CHECKPOINTS_STREAM, subject=owned_objects.meta_subject("h0", base.name), keep=1)
    with pytest.raises(checkpoints.CheckpointUnverified, match=r"checkpoint run-c\.1\.agents\.0 was changed"):
        await checkpoints.load_agents(js, "run-c", 3, [(0, 3)], [(0, 3)], {d3.name: d3.digest}, writers)

    # a link that is gone: named as missing, by the restore and by the check before an interview
    await js.purge_stream(subjects.CHECKPOINTS_STREAM, subject=owned_objects.meta_subject("h0", d2.name))
    with pytest.raises(checkpoints.CheckpointError, match=r"checkpoint run-c\.2\.agents\.0 by h0 is not in the"):
        await checkpoints.load_agents(js, "run-c", 3, [(0, 3)], [(0, 3)], {d3.name: d3.digest}, writers)
    with pytest.raises(checkpoints.CheckpointError, match=r"checkpoint run-c\.2\.agents\.0 is not in the object store"):
        await checkpoints.present(js, [d3.name], writers)


async def test_pruning_to_the_last_round_keeps_the_links_it_builds_on(js):
    chain = checkpoints.Chain()
    digests = {}
    for round_ in (1, 2, 3):
        full = round_ == 2  # round 1's base is left behind by round 2's full one
        saved = await checkpoints.save_agents(js, "run-p", round_, 0, 2,
                                              {"memory": [[round_], [round_]]} if full or round_ == 1
                                              else {"memory": [[round_]]},
                                              writer="h0", changed=None if full or round_ == 1 else [1], chain=chain)
        chain.add(saved, full=full or round_ == 1)
        digests[saved.name] = saved.digest
    await checkpoints.save_env(js, "run-p", 1, {}, {})
    writers = {subjects.checkpoint_agents("run-p", n, 0): "h0" for n in (1, 2, 3)}
    assert await checkpoints.prune(js, "run-p", "last") == 2  # round 1's two; round 2's base stays for round 3
    assert await checkpoints.load_agents(js, "run-p", 3, [(0, 2)], [(0, 2)], digests, writers) == {
        0: {"memory": [2]}, 1: {"memory": [3]}}
    with pytest.raises(checkpoints.CheckpointMissing):
        await owned_objects.read_meta(js, subjects.checkpoint_agents("run-p", 1, 0), "h0")
    held = await bus.stream_subjects(js, subjects.CHECKPOINTS_STREAM, subjects.checkpoint_chunks("h0", "run-p"))
    assert held == {subjects.checkpoint_chunks("h0", "run-p"): 2}  # round 1's chunk went
    assert await checkpoints.prune(js, "run-p", "none") == 2
    assert await bus.stream_subjects(js, subjects.CHECKPOINTS_STREAM, "$O.checkpoints.M.*.run-p.*") == {}
    assert await bus.stream_subjects(js, subjects.CHECKPOINTS_STREAM, subjects.checkpoint_chunks("*", "run-p")) == {}


async def test_a_writer_is_bounded_per_run_and_the_store_as_a_whole_and_starting_a_run_is_never_blocked():
    """Issue 41, attack 2: a host in no run stored 1.5 GB under its own token, and then
    `ctl.run.start` could not be published ("insufficient resources"). Now what one writer stores
    for one run stops at its bound, the store at its limit (each refused write says which), CTL
    keeps its room, and the sweep gives the room back: it purges what belongs to no run, never
    what a run's own writers stored."""
    with EmbeddedNats() as server:
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            await bus.provision(js, storage="memory", checkpoints_max_bytes=8 * 2**20,
                                checkpoints_writer_run_max_bytes=2 * 2**20)
            assert (await js.stream_info(subjects.CHECKPOINTS_STREAM)).config.max_msgs_per_subject == 16
            kv = await js.key_value(subjects.RUNS_BUCKET)
            state = RunState(run_id="real", status="running", config=RunConfig(agents=4, rounds=1),
                             shares=[Share(host_id="h1", ranges=[(0, 4)])],
                             layouts=[Layout(from_round=1, ranges=[(0, 4)], shares=["h1@0"])])
            await kv.put("real", bus.encode(state))
            kept = await checkpoints.save_agents(js, "real", 1, 0, 4, {"memory": [[1]] * 4}, writer="h1")
            await owned_objects.write_object(js, "real.1.env", b"{}", "h9")  # a writer the run never placed

            chunk = b"z" * owned_objects.CHUNK_BYTES
            with pytest.raises(owned_objects.StoreFull, match="h9 has stored all it may for run fake-0 in the "
                                                              "object store 'checkpoints'"):
                for i in range(100):
                    await owned_objects.write_object(js, f"fake-0.{i}.agents.0", chunk, "h9")
            with pytest.raises(owned_objects.StoreFull, match=r"the object store 'checkpoints' is full "
                                                              r"\(POPULACE_CHECKPOINTS_MAX_BYTES\)"):
                for run in range(1, 100):
                    for i in range(15):
                        await owned_objects.write_object(js, f"fake-{run}.{i}.agents.0", chunk, "h9")
            info = await js.stream_info(subjects.CHECKPOINTS_STREAM)
            assert info.state.bytes <= info.config.max_bytes == 8 * 2**20
            # a run's own writer is refused too (its run pauses, naming the store) …
            with pytest.raises(owned_objects.StoreFull, match="is full"):
                await checkpoints.put_bytes(js, "real.1.world", chunk, writer="h1")
            # … but a run's start still goes out: CTL's room is its own
            assert (await js.publish(subjects.RUN_START, b"{}")).stream == subjects.CTL_STREAM

            swept = await checkpoints.sweep(js)
            assert "real" in swept.runs and "fake-0" in swept.runs and swept.messages > 50
            left = await bus.stream_subjects(js, subjects.CHECKPOINTS_STREAM, subjects.CHECKPOINTS_ALL)
            assert sorted(left) == sorted([subjects.checkpoint_chunks("h1", "real"),
                                           owned_objects.meta_subject("h1", kept.name)])
            again = await checkpoints.save_agents(js, "real", 2, 0, 4, {"memory": [[2]] * 4}, writer="h1")
            assert await checkpoints.load_agents(js, "real", 1, [(0, 4)], [(0, 4)], {kept.name: kept.digest},
                                                 {kept.name: "h1"}) == {a: {"memory": [1]} for a in range(4)}
            assert again.size > 0
            assert (await checkpoints.sweep(js)).subjects == 0
        finally:
            await nc.close()
