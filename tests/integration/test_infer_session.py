"""An agent-host's inference session against a gateway that is slow but alive: while the
gateway keeps saying it works on a batch, the session waits for it past its own estimate
instead of sending the same work again (which, on a replica shared by many batches, only
queued it twice and turned a slow round into a pause); a gateway gone silent is still asked
again at once."""

from __future__ import annotations

import asyncio
import time

from nats import errors as nats_errors

from populace.agent_host.publisher import WORKED_ON_TICK_S, OutcomePublisher
from populace.core import subjects
from populace.core.contracts import InferBatch, InferReply, ModelConfig, Progress
from populace.sdk.llm import InferError
from populace.sdk.nats_llm import InferSession


async def _gateway(nc, answer_after_s: float, keepalive: bool, seen: list[str]):
    """A stand-in gateway (a test double): says it has each batch, keeps saying so every 0.2 s
    if asked to, and answers the first batch after `answer_after_s`, any later one at once."""

    async def handle(msg):
        batch = InferBatch.model_validate_json(msg.data)
        seen.append(batch.batch_id)
        await nc.publish(msg.reply, b"", headers={subjects.INFER_ACCEPTED_HEADER: "test-gateway"})
        waited = 0.0
        while waited < answer_after_s and len(seen) == 1:
            await asyncio.sleep(0.2)
            waited += 0.2
            if keepalive:
                await nc.publish(msg.reply, b"", headers={subjects.INFER_ACCEPTED_HEADER: "test-gateway"})
        reply = InferReply(batch_id=batch.batch_id, texts=["42"] * len(batch.keys), valid=[True] * len(batch.keys),
                           attempts=[1] * len(batch.keys), prompt_tokens=[3] * len(batch.keys),
                           completion_tokens=[1] * len(batch.keys))
        await nc.publish(msg.reply, reply.model_dump_json().encode())

    tasks: set[asyncio.Task] = set()

    async def take(msg):  # each batch on its own, as a gateway's dispatcher works on many
        task = asyncio.create_task(handle(msg))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    return await nc.subscribe(subjects.ANY_LLM_INFER, cb=take)


def _session(nc, on_worked_on=None) -> InferSession:
    # the estimate for this batch: 0.5 s + 2 prompts × 1 token × 0.05 s = 0.6 s
    return InferSession(nc, run_id="r1", round_=1, model=ModelConfig(backend="sim", max_tokens=1), system="s",
                        timeout_s=0.5, silence_s=1.0, down_s=30.0, on_worked_on=on_worked_on)


async def test_a_slow_gateway_that_keeps_working_is_waited_for(nc):
    seen: list[str] = []
    sub = await _gateway(nc, answer_after_s=3.0, keepalive=True, seen=seen)
    try:
        alive: list[float] = []
        session = _session(nc, on_worked_on=lambda: alive.append(asyncio.get_running_loop().time()))
        futs = [session.ask("p", key=k) for k in (1, 2)]
        session.flush()
        assert await asyncio.wait_for(asyncio.gather(*futs), 20) == ["42", "42"]
        assert len(seen) == 1 and session.infra_retries == 0  # asked once, never again
        assert len(alive) >= 10  # every keepalive told the host the round is being worked on
        assert session.usage().llm_calls == 2
    finally:
        await sub.unsubscribe()


async def test_a_gateway_gone_silent_is_asked_again(nc):
    seen: list[str] = []
    sub = await _gateway(nc, answer_after_s=3.0, keepalive=False, seen=seen)
    try:
        session = _session(nc)
        futs = [session.ask("p", key=k) for k in (1, 2)]
        session.flush()
        assert await asyncio.wait_for(asyncio.gather(*futs), 30) == ["42", "42"]
        assert len(seen) == 2 and session.infra_retries == 2  # silent for 1 s: both prompts sent again
    finally:
        await sub.unsubscribe()


async def test_a_round_being_worked_on_ticks_progress_now_and_then(nc):
    """While the gateway works, the host ticks progress (0 answered) at most every few seconds:
    the orchestrator's stall deadline then waits for a slow model instead of pausing the run."""
    ticks: list[Progress] = []

    async def got(msg):
        ticks.append(Progress.model_validate_json(msg.data))

    sub = await nc.subscribe(subjects.progress("r1", 2, "h1"), cb=got)
    publisher = OutcomePublisher(nc, nc.jetstream(), run_id="r1", round_=2, host_id="h1")
    for _ in range(50):  # fifty keepalives in a burst: one tick
        publisher.worked_on()
    await nc.flush()
    await asyncio.sleep(0.2)
    assert [(t.run_id, t.round, t.host_id, t.answered) for t in ticks] == [("r1", 2, "h1", 0)]
    publisher._last_worked_on_tick -= WORKED_ON_TICK_S  # as if the interval had passed
    publisher.worked_on()
    await nc.flush()
    await asyncio.sleep(0.2)
    assert len(ticks) == 2
    await sub.unsubscribe()


async def test_an_interview_sessions_shared_question_is_sent_once(nc):
    """An interview's prompts end with its question, the same for everyone: the batch carries it
    once (`suffix`), never into a prompt's routed prefix, and the gateway reads each prompt whole."""
    batches: list[InferBatch] = []

    async def take(msg):
        batch = InferBatch.model_validate_json(msg.data)
        batches.append(batch)
        reply = InferReply(batch_id=batch.batch_id, texts=[batch.prompt(i) for i in range(len(batch.keys))])
        await nc.publish(msg.reply, reply.model_dump_json().encode())

    sub = await nc.subscribe(subjects.ANY_LLM_INFER, cb=take)
    question = "\n\nQuestion: Would you play this game again?\nChoose one of: yes, no."
    prompts = ["I am Ann.", "I am Bob, and I remember round 1.", ""]
    try:
        for shared, expected in ((True, question), (False, None)):
            session = InferSession(nc, run_id="r1", round_=1, model=ModelConfig(backend="dummy"), system="s",
                                   shared_suffix=shared)
            futs = [session.ask(p + question, key=k, prefix_chars=len(p)) for k, p in enumerate(prompts)]
            session.flush()
            assert await asyncio.wait_for(asyncio.gather(*futs), 20) == [p + question for p in prompts]
            assert batches[-1].suffix == expected
        assert batches[0].prompts == prompts
        # a suffix never reaches into a prompt's prefix, nor is a short one split off
        session = InferSession(nc, run_id="r1", round_=1, model=ModelConfig(backend="dummy"), system="s",
                               shared_suffix=True)
        futs = [session.ask("persona A" + question, key=1, prefix_chars=len("persona A") + len(question) - 4),
                session.ask("B. Short end", key=2), session.ask("C. Short end", key=3)]
        session.flush()
        await asyncio.wait_for(asyncio.gather(*futs), 20)
        assert batches[-1].suffix is None
    finally:
        await sub.unsubscribe()


async def test_a_host_held_longer_than_the_silence_does_not_take_it_for_the_gateways(nc):
    """Seconds this process could not read its socket (a million turns woken at once, an author's
    slow view) are not the gateway's silence: the keepalives that came meanwhile are read first."""
    seen: list[str] = []
    sub = await _gateway(nc, answer_after_s=2.0, keepalive=True, seen=seen)
    try:
        session = _session(nc)
        futs = [session.ask("p", key=k) for k in (1, 2)]
        session.flush()
        await asyncio.sleep(0.3)  # the gateway has it
        time.sleep(2.5)  # noqa: ASYNC251 — the point: this loop is held for longer than the 1 s silence
        assert await asyncio.wait_for(asyncio.gather(*futs), 20) == ["42", "42"]
        assert len(seen) == 1 and session.infra_retries == 0
    finally:
        await sub.unsubscribe()


async def test_a_connection_that_cannot_take_a_batch_for_a_while_has_it_sent_again(nc, monkeypatch):
    """nats-py refuses a publish while it reconnects with a full buffer (OutboundBufferLimitError):
    the batch is sent again once it can be, never an exception in a task nobody reads."""
    seen: list[str] = []
    sub = await _gateway(nc, answer_after_s=0.0, keepalive=False, seen=seen)
    real, refused = nc.publish, []

    async def publish(subject, payload=b"", reply="", headers=None):
        if subject.startswith("llm.infer.") and not refused:
            refused.append(subject)
            raise nats_errors.OutboundBufferLimitError
        await real(subject, payload, reply=reply, headers=headers)

    monkeypatch.setattr(nc, "publish", publish)
    try:
        session = _session(nc)
        futs = [session.ask("p", key=k) for k in (1, 2)]
        session.flush()
        assert await asyncio.wait_for(asyncio.gather(*futs), 20) == ["42", "42"]
        assert len(refused) == 1 and len(seen) == 1 and session.infra_retries == 2
    finally:
        await sub.unsubscribe()


async def test_a_send_that_fails_for_a_reason_of_its_own_fails_its_turns_with_the_cause(nc, monkeypatch):
    """Anything else the send raises ends its turns as "no model answered", naming the cause (the
    round pauses on it), and is logged: no turn waits for ever."""

    async def publish(*args, **kwargs):
        raise RuntimeError("a bug in the transport")

    monkeypatch.setattr(nc, "publish", publish)
    session = _session(nc)
    futs = [session.ask("p", key=k) for k in (1, 2)]
    session.flush()
    done = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 10)
    assert all(isinstance(e, InferError) and "RuntimeError: a bug in the transport" in str(e) for e in done)
    await session.drain()
