"""bus.until_ready: transient JetStream errors are retried (bounded, waits doubling up to 2 s),
any other error is raised at once, and the last transient error is raised as it is."""

from __future__ import annotations

import asyncio
import time

import nats.errors
import pytest
from nats.js.errors import BadRequestError

from populace.core import bus


class Flaky:
    def __init__(self, errors: list[Exception]) -> None:
        self.errors, self.calls = errors, 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def test_transient_errors_are_retried_until_the_step_succeeds():
    step = Flaky([nats.errors.TimeoutError(), BadRequestError(err_code=bus.NO_PEERS_YET)])
    t0 = time.monotonic()
    assert asyncio.run(bus.until_ready(step, "test", attempts=3, delay_s=0.05)) == "ok"
    assert step.calls == 3
    assert time.monotonic() - t0 >= 0.05 + 0.1  # waits doubled: 0.05 s, then 0.1 s


def test_a_step_may_be_a_lambda_returning_a_coroutine():
    step = Flaky([nats.errors.TimeoutError()])
    assert asyncio.run(bus.until_ready(lambda: step(), "test", delay_s=0.01)) == "ok"
    assert step.calls == 2


def test_other_errors_are_raised_at_once():
    step = Flaky([BadRequestError(err_code=10058)])
    with pytest.raises(BadRequestError):
        asyncio.run(bus.until_ready(step, "test", delay_s=0.01))
    assert step.calls == 1


def test_the_last_transient_error_is_raised_when_attempts_run_out():
    step = Flaky([nats.errors.NoRespondersError() for _ in range(5)])
    with pytest.raises(nats.errors.NoRespondersError):
        asyncio.run(bus.until_ready(step, "test", attempts=3, delay_s=0.01))
    assert step.calls == 3
    one = Flaky([nats.errors.TimeoutError()])
    with pytest.raises(nats.errors.TimeoutError):  # attempts=1: no retry (publish_js without msg_id)
        asyncio.run(bus.until_ready(one, "test", attempts=1))
    assert one.calls == 1


def test_a_write_to_a_socket_closed_by_a_dying_server_is_transient():
    # uvloop's words when nats-py writes between the server's death and the client noticing it
    closed = RuntimeError("unable to perform operation on <TCPTransport closed=True reading=False 0x5>; "
                          "the handler is closed")
    step = Flaky([closed])
    assert asyncio.run(bus.until_ready(step, "test", delay_s=0.01)) == "ok" and step.calls == 2
    with pytest.raises(RuntimeError, match="a bug"):  # any other RuntimeError is one
        asyncio.run(bus.until_ready(Flaky([RuntimeError("a bug")]), "test", delay_s=0.01))
