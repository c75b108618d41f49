"""A partial that travels by reference (issue 41, item 3), on a real nats-server: the environment
reads its object only once the sender's share is placed, and only as many bytes as the partial
says its object holds (the object's metadata must say so too; chunks beyond it end the read).
A host in no run that names a large object in its partials costs the environment no read."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from populace_ratio_game.rules import partial_of

from populace.core import checkpoints, subjects
from populace.core.contracts import (
    PARTIAL_INLINE_BYTES,
    ConfigRef,
    PartialRef,
    RoundOpen,
    RoundPartial,
    RunConfig,
    RunHead,
    Share,
    partial_object_limit,
)
from populace.environment.app import Environment
from populace.environment.run_tally import BadPartial, RunTally
from populace.sdk.registry import resolve

pytestmark = pytest.mark.integration

CONFIG = RunConfig(agents=7, rounds=3)
SHARES = {"h1@0": 4, "h2@0": 3}
H1 = [(0, 10.0), (1, 20.0), (2, None), (3, 90.0)]


def name(host: str, round_: int = 1) -> str:
    return subjects.checkpoint_partial("r1", round_, f"{host}@0")


async def store(js, name: str, data: bytes, writer: str) -> PartialRef:
    digest = await checkpoints.put_bytes(js, name, data, writer=writer)
    return PartialRef(ref=name, sha256=digest, size=len(data))


async def test_a_bounded_read_returns_the_object_and_refuses_one_larger_than_its_bound(js):
    data = bytes(range(256)) * 2048  # 512 KB: four chunks
    ref = await store(js, name("h1"), data, "h1")
    assert await checkpoints.get_bytes(js, ref.ref, ref.sha256, max_bytes=ref.size) == data
    with pytest.raises(checkpoints.CheckpointError):  # its metadata says more than the bound: nothing read
        await checkpoints.get_bytes(js, ref.ref, ref.sha256, max_bytes=1000)


def environment(js, head: RunHead, monkeypatch) -> tuple[Environment, RunTally, list[str]]:
    """The environment service's logic on a real JetStream, the run's state in KV stood in for
    by `head`; every object read is listed."""
    env = Environment(SimpleNamespace(js=js, log=None))
    resolved = resolve(CONFIG)
    tally = RunTally("r1", resolved, resolved.simulation.Env(resolved.instance("r1")))
    reads: list[str] = []
    real = checkpoints.get_bytes

    async def get_bytes(js_, name, expected, *, writer=None, max_bytes=None):
        reads.append(name)
        return await real(js_, name, expected, writer=writer, max_bytes=max_bytes)

    async def head_of(run_id: str) -> RunHead | None:
        return head

    env.head_of = head_of  # type: ignore[method-assign]
    monkeypatch.setattr(checkpoints, "get_bytes", get_bytes)
    return env, tally, reads


def by_reference(host: str, ref: PartialRef, n: int = 4) -> RoundPartial:
    return RoundPartial(run_id="r1", round=1, host_id=host, n=n, n_valid=n,
                        payload=ref.model_dump())


async def test_a_partial_from_a_share_never_placed_is_refused_before_its_object_is_read(js, monkeypatch):
    head = RunHead(run_id="r1", status="running", shares=[Share(host_id="h1", ranges=[(0, 4)]),
                                                          Share(host_id="h2", ranges=[(4, 3)])])
    env, tally, reads = environment(js, head, monkeypatch)
    bomb = await store(js, name("h9"), b"[" + b"0," * (PARTIAL_INLINE_BYTES * 2) + b"0]", "h9")
    # its round announced: the placement refuses the sender
    tally.open(RoundOpen(run_id="r1", round=1, expected=7, config_ref=ConfigRef.of(CONFIG), opened_at=0.0,
                         shares=SHARES))
    with pytest.raises(BadPartial, match=r"share h9@0 was never placed in run r1 \(round 1, epoch 0\)"):
        await env.read_reference(tally, by_reference("h9", bomb))
    # its round not announced here yet: the run's placement in KV refuses it
    early = by_reference("h9", bomb.model_copy(update={"ref": name("h9", 2)})).model_copy(update={"round": 2})
    with pytest.raises(BadPartial, match="share h9@0 was never placed in run r1"):
        await env.read_reference(tally, early)
    assert reads == []


async def test_a_placed_share_s_partial_is_read_within_its_size_and_refused_past_its_limit(js, monkeypatch):
    head = RunHead(run_id="r1", status="running", shares=[Share(host_id="h1", ranges=[(0, 4)]),
                                                          Share(host_id="h2", ranges=[(4, 3)])])
    env, tally, reads = environment(js, head, monkeypatch)
    tally.open(RoundOpen(run_id="r1", round=1, expected=7, config_ref=ConfigRef.of(CONFIG), opened_at=0.0,
                         shares=SHARES))
    payload = partial_of(H1).model_dump(mode="json")
    ref = await store(js, name("h1"), json.dumps(payload).encode(), "h1")
    read = await env.read_reference(tally, by_reference("h1", ref))
    assert read is not None and read.payload == payload and reads == [name("h1")]
    # a size the object does not have: refused, named
    with pytest.raises(BadPartial, match=r"cannot be used: it holds [\d,]+ bytes, not the [\d,]+ its partial says"):
        await env.read_reference(tally, by_reference("h1", ref.model_copy(update={"size": ref.size + 1})))
    # more than a share of 4 agents may send: refused before any read
    reads.clear()
    huge = ref.model_copy(update={"size": partial_object_limit(4) + 1})
    with pytest.raises(BadPartial, match=r"has 1,049,601 bytes; a partial of 4 agents may have 1,049,600"):
        await env.read_reference(tally, by_reference("h1", huge))
    # another share's object, or a reference that is not one
    with pytest.raises(BadPartial, match=f"names '{name('h2')}', not its own object {name('h1')}"):
        await env.read_reference(tally, by_reference("h1", ref.model_copy(update={"ref": name("h2")})))
    bad = RoundPartial(run_id="r1", round=1, host_id="h1", n=4, n_valid=4, payload={"$ref": name("h1")})
    with pytest.raises(BadPartial, match="names its object wrongly: sha256"):
        await env.read_reference(tally, bad)
    assert reads == []
    # a straggler of a decided round is never read
    tally.open(RoundOpen(run_id="r1", round=2, expected=7, config_ref=ConfigRef.of(CONFIG), opened_at=0.0,
                         shares=SHARES))
    assert await env.read_reference(tally, by_reference("h1", ref)) is None and reads == []


async def test_a_partial_object_holding_nan_or_no_partial_is_refused(js, monkeypatch):
    head = RunHead(run_id="r1", status="running", shares=[Share(host_id="h1", ranges=[(0, 4)])])
    env, tally, _ = environment(js, head, monkeypatch)
    tally.open(RoundOpen(run_id="r1", round=1, expected=7, config_ref=ConfigRef.of(CONFIG), opened_at=0.0,
                         shares=SHARES))
    for data, why in ((b'{"sum": NaN}', "cannot be used"), (b"[1, 2]", "holds list, not a partial")):
        ref = await store(js, name("h1"), data, "h1")
        with pytest.raises(BadPartial, match=why):
            await asyncio.wait_for(env.read_reference(tally, by_reference("h1", ref)), 30)
