"""Asking JetStream again through what is transient (a new stream's leader election, a cluster
whose routes are not up yet, a connection caught mid-reconnect), and only that."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import nats
import nats.errors
from nats.js.errors import BadRequestError, NoStreamResponseError, ServiceUnavailableError
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from populace.core import logs
from populace.core.bus.connection import PermissionDenied, denials, refusal

log = logs.get("populace.bus")  # every part of the bus logs under one name


# A replicated stream that was just created has no Raft leader for a moment: API calls then
# time out or get "no response from stream". Those are transient; anything else is not.
# A connection that is reconnecting refuses publishes once its buffer is full, or at once where it
# buffers none: transient too, the same publish goes through once it is back.
TRANSIENT = (nats.errors.TimeoutError, asyncio.TimeoutError, nats.errors.NoRespondersError,
             NoStreamResponseError, ServiceUnavailableError, nats.errors.OutboundBufferLimitError,
             nats.errors.ConnectionReconnectingError, nats.errors.StaleConnectionError)
# A cluster whose servers have just started may not know its peers yet: placing a replicated
# stream then fails with "no suitable peers for placement" until the routes are up.
NO_PEERS_YET = 10005


def _transient(err: Exception) -> bool:
    return (isinstance(err, TRANSIENT) or (isinstance(err, BadRequestError) and err.err_code == NO_PEERS_YET)
            or _closed_transport(err))


def _closed_transport(err: Exception) -> bool:
    """A write caught between a nats-server's death and the client noticing it: uvloop refuses
    to write to the closed socket ("unable to perform operation on <TCPTransport closed=True …>;
    the handler is closed"). The client reconnects on its own; asking again then succeeds."""
    return isinstance(err, RuntimeError) and "TCPTransport closed=True" in str(err)


async def until_ready(step, what: str, attempts: int = 12, delay_s: float = 0.25):
    """Run `step()` until it succeeds, retrying transient JetStream errors (bounded: the last
    error is raised as it is; so is any other error, at once). Waits double from `delay_s`, up to 2 s."""
    refused = denials.count

    def again(err: BaseException) -> bool:
        if denials.count > refused and isinstance(err, TRANSIENT):
            raise PermissionDenied(f"{what}: {refusal()}") from err
        return _transient(err)

    async for attempt in AsyncRetrying(
        retry=retry_if_exception(again), stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=delay_s, max=2.0), reraise=True,
        before_sleep=lambda rs: log.info("jetstream_not_ready", what=what, attempt=rs.attempt_number,
                                         error=type(rs.outcome.exception()).__name__),
    ):
        with attempt:  # `step` may be a lambda returning a coroutine: awaited here, not by tenacity
            return await step()


T = TypeVar("T")
RECONNECT_POLL_S = 0.1  # how often a wait looks at the connection's reconnect count


class Reconnected(nats.errors.TimeoutError):
    """A wait given up: the connection was renewed since its requests were sent, so their replies
    cannot come (transient: asked again, they are answered)."""

    def __str__(self) -> str:
        return "nats: reconnected since the request was sent: its reply is lost"


async def unless_reconnected(nc, awaitable: Awaitable[T], since: int | None = None) -> T:
    """`awaitable` (requests on `nc`: publishes awaiting their PubAcks), given up as soon as `nc`
    has reconnected since they were sent (`since`: its reconnect count then; by default, now):
    their replies went with the old connection, so waiting out a request timeout only delays the
    retry. Raised as Reconnected, a TimeoutError, which until_ready asks again. The count is
    nats-py's own (`stats["reconnects"]`), read every RECONNECT_POLL_S: no callback to register on
    a connection the caller does not own."""
    before = nc.stats["reconnects"] if since is None else since
    task = asyncio.ensure_future(awaitable)
    try:
        while not task.done():
            if nc.stats["reconnects"] != before:
                raise Reconnected  # from the `finally`: the request is cancelled
            await asyncio.wait({task}, timeout=RECONNECT_POLL_S)
        return task.result()
    finally:
        if not task.done():  # given up (or this wait was cancelled): not awaited, so no cancel is swallowed
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # its error is no one's now
