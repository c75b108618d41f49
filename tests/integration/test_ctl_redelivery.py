"""The orchestrator's control requests delivered again by a real nats-server: a handler that dies
after writing the run's state but before its ack (here: raises, so the message is NACKed; a
SIGKILL gives the same redelivery after the ack wait) gets the same message again, maybe after a
newer request changed the run. The redelivery must change nothing: a cancel that comes back after
the resume that followed it does not stop the resumed run, and a resume that comes back after the
run was cancelled again does not start a second epoch. And a stop decided but never said (the
orchestrator died between the state's write and the RunDone) is said by the next one."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from populace.core import bus, metrics, subjects
from populace.core.contracts import HostInfo, RunCancel, RunConfig, RunDone, RunResume, RunStart, RunState
from populace.core.natsserver import EmbeddedNats
from populace.core.settings import Settings
from populace.orchestrator import app

pytestmark = pytest.mark.integration


async def state(js, rid: str) -> RunState:
    return RunState.model_validate_json((await (await js.key_value(subjects.RUNS_BUCKET)).get(rid)).value)


async def until(js, rid: str, cond, what: str, timeout: float = 20) -> RunState:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            s = await state(js, rid)
            if cond(s):
                return s
        except Exception:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {rid}: never {what}")


async def publish(js, subject: str, model) -> None:
    await js.publish(subject, model.model_dump_json().encode(), stream=subjects.CTL_STREAM)


@pytest.fixture
async def orchestrator(monkeypatch):
    """A real nats-server of its own, a registered host, and the orchestrator built by its factory
    with its handlers wrapped: `dies[name]` set makes the next call of that handler do its work,
    wait for `dies[name]` to be set again... (an Event), then raise before its ack."""
    dies: dict[str, asyncio.Event] = {}
    handled: list[tuple[str, int]] = []  # (handler, delivery) once each call has returned or raised

    def wrap(name: str):
        original = getattr(app.Orchestrator, name)

        async def handler(self, request, msg):
            try:
                await original(self, request, msg)
                if (release := dies.pop(name, None)) is not None:
                    await release.wait()
                    raise RuntimeError(f"{name}: died after the state's write, before the ack")
            finally:
                handled.append((name, msg.raw_message.metadata.num_delivered))

        monkeypatch.setattr(app.Orchestrator, name, handler)

    wrap("on_cancel")
    wrap("on_resume")
    with EmbeddedNats() as server:
        nc = await bus.connect(server.url, "ctl-redelivery-test")
        js = nc.jetstream()
        await bus.provision(js, storage="memory")
        now = time.time()
        hosts = await js.key_value(subjects.HOSTS_BUCKET)
        held = {"agents": 0}  # what h1 says it holds: a test may fill it
        heartbeat = bus.Heartbeat(hosts, "h1", lambda: HostInfo(host_id="h1", capacity=1000, agents=held["agents"],
                                                                   pid=os.getpid(), started_at=now,
                                                                   heartbeat_at=time.time()), 0.5)
        await heartbeat.start()
        svc = app.create(Settings(nats_url=server.url, storage="memory", ack_wait_s=2.0))
        await svc._connect_and_provision()
        await svc.broker.start()
        try:
            yield js, dies, handled, server.url, held
        finally:
            await svc.broker.stop()
            await heartbeat.stop()
            await nc.close()


async def handled_again(handled: list, name: str) -> None:
    """Until the handler `name` has returned (or raised) on a second delivery."""
    for _ in range(400):
        if (name, 2) in handled:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} never got its request again: {handled}")


async def started(js, rid: str) -> RunState:
    await publish(js, subjects.RUN_START, RunStart(run_id=rid, config=RunConfig(agents=10, rounds=3)))
    return await until(js, rid, lambda s: s.status == "spawning", "placed")


async def test_a_cancel_delivered_again_after_the_resume_that_followed_it_leaves_the_run_going(orchestrator):
    js, dies, handled, *_ = orchestrator
    await started(js, "redo-cancel")
    release = dies["on_cancel"] = asyncio.Event()
    await publish(js, subjects.RUN_CANCEL, RunCancel(run_id="redo-cancel"))
    await until(js, "redo-cancel", lambda s: s.status == "cancelled", "cancelled")
    await publish(js, subjects.RUN_RESUME, RunResume(run_id="redo-cancel"))
    resumed = await until(js, "redo-cancel", lambda s: s.epoch == 1 and s.status == "spawning", "resumed")
    release.set()  # the cancel's handler dies now: the server hands the cancel out again
    await handled_again(handled, "on_cancel")
    after = await state(js, "redo-cancel")
    assert (after.status, after.epoch, after.request_seq) == ("spawning", 1, resumed.request_seq)


async def test_a_resume_delivered_again_after_the_run_was_cancelled_again_leaves_it_stopped(orchestrator):
    js, dies, handled, *_ = orchestrator
    await started(js, "redo-resume")
    await publish(js, subjects.RUN_CANCEL, RunCancel(run_id="redo-resume", reason="first"))
    await until(js, "redo-resume", lambda s: s.status == "cancelled", "cancelled")
    release = dies["on_resume"] = asyncio.Event()
    await publish(js, subjects.RUN_RESUME, RunResume(run_id="redo-resume"))
    await until(js, "redo-resume", lambda s: s.epoch == 1, "resumed")
    await publish(js, subjects.RUN_CANCEL, RunCancel(run_id="redo-resume", reason="second"))
    cancelled = await until(js, "redo-resume", lambda s: s.status == "cancelled" and s.reason == "second",
                            "cancelled again")
    release.set()
    await handled_again(handled, "on_resume")
    after = await state(js, "redo-resume")
    assert (after.status, after.epoch, after.reason) == ("cancelled", 1, "second")
    assert after.request_seq == cancelled.request_seq


async def done_of(js, rid: str) -> RunDone | None:
    return await bus.last_on(js, subjects.RUN_STREAM, subjects.run_done(rid), RunDone)


async def test_a_stop_whose_run_done_was_never_published_is_published_by_the_next_orchestrator(orchestrator):
    js, _, _, url, _ = orchestrator
    placed = await started(js, "unsaid")
    # what an orchestrator that died right after writing the stop leaves: the state, no RunDone
    kv = await js.key_value(subjects.RUNS_BUCKET)
    entry = await kv.get("unsaid")
    stopped = placed.model_copy(update={"status": "cancelled", "reason": "by a dead orchestrator",
                                        "stop_announced": False})
    await kv.update("unsaid", bus.encode(stopped), last=entry.revision)
    assert await done_of(js, "unsaid") is None
    successor = app.create(Settings(nats_url=url, storage="memory", ack_wait_s=2.0, heartbeat_s=0.2))
    await successor._connect_and_provision()
    for hook in successor._startup_hooks:  # adopts the runs in KV, as after a restart
        await hook()
    try:
        said = await until(js, "unsaid", lambda s: s.stop_announced, "said")
        done = await done_of(js, "unsaid")
        assert done is not None and (done.status, done.reason, done.epoch) == ("cancelled", "by a dead orchestrator", 0)
        assert said.status == "cancelled"
    finally:
        for hook in successor._shutdown_hooks:
            await hook()
        await successor.broker.stop()


async def test_a_stop_whose_publish_failed_is_said_when_its_request_comes_again(orchestrator, monkeypatch):
    js, _, handled, *_ = orchestrator
    await started(js, "retold")
    original, calls = app.Orchestrator.publish_done, []

    async def publish_done(self, rid, action, epoch=0):
        calls.append(rid)
        if len(calls) == 1:
            raise RuntimeError("no answer from JetStream")
        await original(self, rid, action, epoch)

    monkeypatch.setattr(app.Orchestrator, "publish_done", publish_done)
    counted = metrics.RUNS.labels("cancelled")._value.get()
    await publish(js, subjects.RUN_CANCEL, RunCancel(run_id="retold"))
    said = await until(js, "retold", lambda s: s.stop_announced and s.status == "cancelled", "said")
    assert len(calls) == 2 and ("on_cancel", 2) in handled
    assert metrics.RUNS.labels("cancelled")._value.get() == counted + 1  # counted once, when said
    done = await done_of(js, "retold")
    assert done is not None and done.status == "cancelled" and said.epoch == done.epoch == 0


async def test_a_start_delivered_again_while_its_run_fills_the_hosts_does_not_fail_the_run(orchestrator):
    """The orchestrator may die between the run's creation and the start's ack: the start comes
    again, now with the hosts full of the run's own agents. It must be seen as the same run's start
    (before any placement), not refused for want of room, which said `failed` of a running run."""
    js, *_, held = orchestrator
    start = RunStart(run_id="again", config=RunConfig(agents=1000, rounds=3))  # all of h1's room
    await publish(js, subjects.RUN_START, start)
    placed = await until(js, "again", lambda s: s.status == "spawning", "placed")
    held["agents"] = 1000  # h1 holds them now, and says so from its next beat
    await asyncio.sleep(1.0)
    await publish(js, subjects.RUN_START, start)  # the same start again (past the dedupe window)
    await asyncio.sleep(6)  # beyond the orchestrator's wait for room (two heartbeats of 2 s)
    assert await done_of(js, "again") is None
    assert (await state(js, "again")).model_dump(exclude={"updated_at"}) == placed.model_dump(exclude={"updated_at"})
