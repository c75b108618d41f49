"""An agent-host's interview answers wait for JetStream: a survey keeps at most PUBLISHING
answer batches waiting for their PubAck, and no new answers start meanwhile (a slow server
would otherwise hold every answer of the share in the host's memory). A post-hoc order placed
again sends new messages; an order the host cannot answer is said, naming the request."""

from __future__ import annotations

import asyncio

import pytest

from populace.agent_host.interviews import PUBLISHING, AnswerPublisher
from populace.core.contracts import Survey, Usage
from populace.sdk import interview

SURVEY = Survey(id="s", questions=[{"id": "q", "text": "Yes?", "options": ["yes", "no"]}])


class SlowStream:
    """A JetStream stand-in whose PubAcks come only once `acks` is set (or fail with `error`)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.acks = asyncio.Event()
        self.published: list[str] = []
        self.ids: list[str | None] = []
        self.error = error

    async def publish(self, subject, data, headers=None, timeout=None):
        self.published.append(subject)
        self.ids.append((headers or {}).get("Nats-Msg-Id"))
        await self.acks.wait()
        if self.error is not None:
            raise self.error


def rows(n: int) -> dict[str, list]:
    return {"agent_id": list(range(n)), "question": ["q"] * n, "answer": ["yes"] * n, "value": [None] * n,
            "raw": ['{"answer": "yes"}'] * n, "valid": [True] * n, "error": [None] * n, "latency_ms": [1.0] * n}


def publisher(js) -> AnswerPublisher:
    return AnswerPublisher(js, run_id="r1", round_=1, host_id="h", epoch=0, survey=SURVEY, request="q1")


async def test_answers_wait_while_too_many_batches_wait_for_their_pubacks():
    js = SlowStream()
    out = publisher(js)
    for _ in range(PUBLISHING - 1):
        out.emit(rows(2), Usage())
    await asyncio.wait_for(out.room(), 1)  # room for one more
    out.emit(rows(2), Usage())
    waiting = asyncio.ensure_future(out.room())
    await asyncio.sleep(0.05)
    assert not waiting.done()  # PUBLISHING batches out: no new answers start
    js.acks.set()
    await asyncio.wait_for(waiting, 5)
    await asyncio.wait_for(out.close(Usage()), 5)
    assert out.rows == 2 * PUBLISHING and len(js.published) == PUBLISHING
    assert tuple(rows(0)) == interview.ROW_KEYS  # the columns an emitted batch has


async def test_a_batch_that_cannot_be_stored_fails_the_survey_on_close():
    js = SlowStream(error=RuntimeError("stream full"))
    out = publisher(js)
    out.emit(rows(2), Usage())
    js.acks.set()
    await asyncio.wait_for(out.room(), 5)
    with pytest.raises(RuntimeError, match="stream full"):
        await asyncio.wait_for(out.close(Usage(llm_calls=1)), 5)


async def test_a_host_ordered_again_sends_its_answers_as_new_messages():
    """A host ordered again for the same request (a lost host's ranges) numbers its batches from 0
    again: its message ids name the placement, so JetStream does not drop them as duplicates of
    its first order's."""
    js = SlowStream()
    js.acks.set()
    first, again = publisher(js), AnswerPublisher(js, run_id="r1", round_=1, host_id="h", epoch=0, survey=SURVEY,
                                                  request="q1", placement=1)
    for out in (first, again):
        out.emit(rows(2), Usage())
        await out.close(Usage())
    assert len(js.ids) == 2 and js.ids[0] != js.ids[1] and "-p1-" in js.ids[1] and "-p" not in js.ids[0]


async def test_an_order_the_host_cannot_answer_fails_the_interview_naming_why():
    """The config (or checkpoint) of an order cannot be read: the host says so (a fault naming the
    request), so whoever asked stops waiting instead of waiting out its timeout."""
    from populace.agent_host.interviews import Interviewer
    from populace.core.contracts import ConfigRef, InterviewOrder, Restore, RunConfig
    from populace.core.settings import Settings

    class NoStore:
        def __getattr__(self, name):
            async def refuse(*a, **kw):
                raise OSError("object store checkpoints is gone")
            return refuse

    said = []

    async def report(run_id, round_, request, reason):
        said.append((run_id, round_, request, reason))

    host = Interviewer(None, NoStore(), Settings(), "h", report_interview_fault=report)
    order = InterviewOrder(run_id="r-gone", host_id="h", request="iv-1", after_round=2, survey=SURVEY,
                           ranges=[(0, 10)], restore=Restore(run_id="r-gone", round=2, ranges=[(0, 10)]),
                           config_ref=ConfigRef.of(RunConfig(agents=10, rounds=3)))
    await host._ordered(order, lambda config: None)
    (fault,) = said
    assert fault == ("r-gone", 2, "iv-1", "OSError: object store checkpoints is gone")
