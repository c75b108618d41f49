"""Idempotent node requests: a StartProcess carries a request id (set by node_request), and the
node's reply memory answers a repeat of it with the first reply without doing it again."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from populace.client.nodes import with_request_id
from populace.core.contracts import AgentHostSpec, ListProcesses, StartProcess
from populace.node.replies import Replies, ReusedRequestId


class Counter:
    def __init__(self, delay: float = 0.0) -> None:
        self.calls, self.delay = 0, delay

    async def __call__(self) -> bytes:
        self.calls += 1
        await asyncio.sleep(self.delay)
        return f"reply {self.calls}".encode()


async def test_a_repeated_id_gets_the_first_reply_and_runs_nothing():
    replies, answer = Replies(), Counter()
    assert await replies.once("r1", "body", answer) == (b"reply 1", False)
    assert await replies.once("r1", "body", answer) == (b"reply 1", True)
    assert answer.calls == 1
    assert await replies.once("r2", "body", answer) == (b"reply 2", False)


async def test_without_an_id_every_request_runs():
    replies, answer = Replies(), Counter()
    await replies.once(None, "body", answer)
    await replies.once(None, "body", answer)
    assert answer.calls == 2 and len(replies) == 0


async def test_a_repeat_during_the_first_waits_for_its_reply():
    replies, answer = Replies(), Counter(delay=0.05)
    both = await asyncio.gather(replies.once("r1", "b", answer), replies.once("r1", "b", answer))
    assert sorted(both) == [(b"reply 1", False), (b"reply 1", True)] and answer.calls == 1


async def test_the_same_id_on_another_request_is_refused():
    replies = Replies()
    await replies.once("r1", "start 1", Counter())
    with pytest.raises(ReusedRequestId, match="'r1' was already used"):
        await replies.once("r1", "start 2", Counter())


async def test_only_the_last_ids_are_remembered():
    replies, answer = Replies(size=3), Counter()
    for i in range(5):
        await replies.once(f"r{i}", "b", answer)
    assert len(replies) == 3
    assert (await replies.once("r4", "b", answer))[1] is True  # kept
    assert (await replies.once("r0", "b", answer))[1] is False  # forgotten: done again
    assert answer.calls == 6


async def test_an_answer_cut_short_is_forgotten_so_a_repeat_runs_again():
    replies = Replies()

    async def cancelled() -> bytes:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await replies.once("r1", "b", cancelled)
    assert await replies.once("r1", "b", Counter()) == (b"reply 1", False)


def test_node_request_gives_a_start_an_id_once_and_keeps_a_given_one():
    start = StartProcess(spec=AgentHostSpec(), count=2)
    sent = with_request_id(start)
    assert start.request_id is None and sent.request_id and len(sent.request_id) == 32
    assert with_request_id(sent) is sent
    assert with_request_id(StartProcess(spec=AgentHostSpec(), request_id="mine-1")).request_id == "mine-1"
    assert with_request_id(ListProcesses()) == ListProcesses()


@pytest.mark.parametrize("bad", ["", "a.b", "a b", "*", ">", "x" * 65, "a/b"])
def test_a_request_id_is_a_short_token(bad):
    with pytest.raises(ValidationError, match="request_id"):
        StartProcess(spec=AgentHostSpec(), request_id=bad)


def test_the_managers_node_form_sends_its_page_id_as_the_request_id():
    from populace.manager.app import start_request

    form = {"kind": "agent-host", "count": "2", "request_id": "0123abcd"}
    assert start_request(form).request_id == "0123abcd"  # a double-clicked form: one start
    assert start_request({"kind": "agent-host"}).request_id is None  # node_request gives it one
