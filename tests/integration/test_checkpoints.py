"""Checkpoints on a real object store: each object is read only against the digest its writer
reported, so one rewritten by anyone else (every host may write the bucket) is never used."""

from __future__ import annotations

import pytest

from populace.core import checkpoints, subjects

pytestmark = pytest.mark.integration


async def test_a_checkpoint_is_read_only_if_it_still_has_the_digest_its_writer_reported(js):
    stored = await checkpoints.save_agents(js, "run-a", 1, 0, 2, {"memory": [[1], [2]]}, writer="h0")
    env = await checkpoints.save_env(js, "run-a", 1, {"winners": [3.0]}, {"history": [3.0]})
    assert stored.name == subjects.checkpoint_agents("run-a", 1, 0) and stored.size > 0
    digests = {stored.name: stored.digest, env.name: env.digest}
    assert await checkpoints.load_agents(js, "run-a", 1, [(0, 2)], [(0, 2)], digests) == {
        0: {"memory": [1]}, 1: {"memory": [2]}}
    assert await checkpoints.load_env(js, "run-a", 1, digests) == ({"winners": [3.0]}, {"history": [3.0]}, None, None,
                                                                   None)

    # another writer replaces both objects with well-formed state of its own
    await checkpoints.save_agents(js, "run-a", 1, 0, 2, {"memory": [[99], [99]]}, writer="h9")
    await checkpoints.save_env(js, "run-a", 1, {"winners": [0.0]}, {"history": [0.0]})
    with pytest.raises(checkpoints.CheckpointUnverified,
                       match=r"checkpoint run-a\.1\.agents\.0 was changed after its writer stored it"):
        await checkpoints.load_agents(js, "run-a", 1, [(0, 2)], [(1, 1)], digests)
    with pytest.raises(checkpoints.CheckpointUnverified, match=r"checkpoint run-a\.1\.env was changed"):
        await checkpoints.load_env(js, "run-a", 1, digests)


async def test_a_checkpoint_nobody_reported_a_digest_of_is_not_used(js):
    await checkpoints.save_agents(js, "run-b", 2, 0, 1, {"memory": [[1]]}, writer="h0")
    with pytest.raises(checkpoints.CheckpointUnverified, match=r"run-b\.2\.agents\.0 has no digest recorded"):
        await checkpoints.load_agents(js, "run-b", 2, [(0, 1)], [(0, 1)], {})
    # an object that is not there is named as missing, not as changed
    with pytest.raises(checkpoints.CheckpointError, match="is not in the object store"):
        await checkpoints.load_env(js, "run-b", 2, {subjects.checkpoint_env("run-b", 2): "0" * 64})


async def test_a_delta_chain_restores_every_agent_and_refuses_a_forged_or_missing_link(js):
    """A base and two deltas (agents that acted only) restore to exactly the full state; a link
    rewritten by another writer, or gone, stops the restore naming it."""
    chain = checkpoints.Chain()
    base = await checkpoints.save_agents(js, "run-c", 1, 0, 3, {"memory": [[1], [1], [1]]}, writer="h0")
    chain.add(base, full=True)
    d2 = await checkpoints.save_agents(js, "run-c", 2, 0, 3, {"memory": [[1, 2]]}, writer="h0", changed=[1],
                                       chain=chain)
    chain.add(d2, full=False)
    d3 = await checkpoints.save_agents(js, "run-c", 3, 0, 3, {"memory": [[1, 3], [1, 2, 3]]}, writer="h0",
                                       changed=[0, 1], chain=chain)
    assert await checkpoints.load_agents(js, "run-c", 3, [(0, 3)], [(0, 3)], {d3.name: d3.digest}) == {
        0: {"memory": [1, 3]}, 1: {"memory": [1, 2, 3]}, 2: {"memory": [1]}}
    assert await checkpoints.load_agents(js, "run-c", 2, [(0, 3)], [(2, 1)], {d2.name: d2.digest}) == {
        2: {"memory": [1]}}
    await checkpoints.present(js, [d3.name])  # its links are there too

    # the base rewritten by someone else: the delta's own digest still matches, its base does not
    await checkpoints.save_agents(js, "run-c", 1, 0, 3, {"memory": [[7], [7], [7]]}, writer="h9")
    with pytest.raises(checkpoints.CheckpointUnverified, match=r"checkpoint run-c\.1\.agents\.0 was changed"):
        await checkpoints.load_agents(js, "run-c", 3, [(0, 3)], [(0, 3)], {d3.name: d3.digest})

    # a link that is gone: named as missing, by the restore and by the check before a resume or fork
    await js.purge_stream(f"OBJ_{subjects.CHECKPOINTS_BUCKET}",  # as a prune deletes it (the bucket refuses rollups)
                          subject=f"$O.{subjects.CHECKPOINTS_BUCKET}.M.{checkpoints._b64(d2.name)}")
    with pytest.raises(checkpoints.CheckpointError, match=r"checkpoint run-c\.2\.agents\.0 is not in the object store"):
        await checkpoints.load_agents(js, "run-c", 3, [(0, 3)], [(0, 3)], {d3.name: d3.digest})
    with pytest.raises(checkpoints.CheckpointError, match=r"checkpoint run-c\.2\.agents\.0 is not in the object store"):
        await checkpoints.present(js, [d3.name])


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
    assert await checkpoints.prune(js, "run-p", "last") == 1  # round 1's; round 2's base stays for round 3
    assert await checkpoints.load_agents(js, "run-p", 3, [(0, 2)], [(0, 2)], digests) == {
        0: {"memory": [2]}, 1: {"memory": [3]}}
    assert await checkpoints.prune(js, "run-p", "none") == 2
