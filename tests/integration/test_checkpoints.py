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
    assert await checkpoints.load_env(js, "run-a", 1, digests) == ({"winners": [3.0]}, {"history": [3.0]}, None, None)

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
