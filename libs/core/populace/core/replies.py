"""Requests answered only on the requester's own reply subjects.

A service that answers requests (the gateway's `llm.infer.<requester>`, the recorder's
`recorder.read.<verb>.<requester>`, a node's `node.<id>.<verb>.<requester>`) must never publish
where a requester merely asks it to: with a blanket `allow_responses`, one `llm.infer` whose
reply subject was `$JS.API.STREAM.DELETE.RUN` had the gateway delete stream RUN. So:
- the request subject's last token names the requester, and the NATS permissions let only that
  user publish it (a host's own user: `llm.infer.<host id>`), so the responder knows who asked;
- the responder answers only on `reply.<responder>.<requester>.…` (subjects.reply_prefix) and
  refuses any other reply subject: the request is dead-lettered once, naming its sender;
- each responder may publish `reply.<itself>.>` and nothing shaped like an inbox or an API call,
  each user may subscribe to `reply.*.<user>.>` only.
`request()` is the requester's side: nats-py's `request()` answers on the connection's inbox,
which no responder may publish to any more."""

from __future__ import annotations

import asyncio
import weakref

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.nuid import NUID

from populace.core import subjects

# The requester token of a connection without a NATS user (an open bus, where anyone may
# publish anything anyway).
ANONYMOUS = "anonymous"
_nuid = NUID()


def requester(conn, fallback: str = ANONYMOUS) -> str:
    """Who a connection asks as: its NATS user (the permissions bind it to its request
    subjects), else `fallback`. `conn`: a nats-py Client or JetStreamContext."""
    nc = getattr(conn, "_nc", conn)
    return (getattr(nc, "options", None) or {}).get("user") or fallback


def new_reply(responder: str, requester_: str) -> str:
    """A fresh reply subject of `requester_` for one of `responder`'s answers."""
    return subjects.reply_prefix(responder, requester_) + _nuid.next().decode()


def refusal(responder: str, subject: str, reply: str | None) -> str | None:
    """Why `responder` must not answer a request on `subject` at `reply` (None: it may): the
    reply subject must be one of the requester's own, which the subject's last token names."""
    who = subjects.requester_of(subject)
    if "." not in subject or not subjects.valid_token(who):
        return f"request subject {subject!r} names no requester"
    if not reply:
        return f"request from {who} has no reply subject"
    prefix = subjects.reply_prefix(responder, who)
    if not reply.startswith(prefix) or len(reply) == len(prefix) or any(c in reply for c in " *>\t\r\n"):
        return f"reply subject {reply[:120]!r} is not one of requester {who}'s ({prefix}…)"
    return None


class _Mux:
    """One wildcard subscription per connection and responder, answers matched by token (as
    nats-py's own request mux does on the inbox)."""

    def __init__(self, nc: Client, responder: str) -> None:
        self.nc = nc
        self.prefix = new_reply(responder, requester(nc))
        self.waiting: dict[str, asyncio.Future] = {}
        self.ready: asyncio.Future | None = None

    async def start(self) -> None:
        await self.nc.subscribe(f"{self.prefix}.*", cb=self.on_reply)

    async def on_reply(self, msg: Msg) -> None:
        fut = self.waiting.pop(msg.subject[len(self.prefix) + 1:], None)
        if fut is not None and not fut.done():
            fut.set_result(msg)


_muxes: weakref.WeakKeyDictionary[Client, dict[str, _Mux]] = weakref.WeakKeyDictionary()


async def _mux(nc: Client, responder: str) -> _Mux:
    by_responder = _muxes.setdefault(nc, {})
    mux = by_responder.get(responder)
    if mux is None:
        mux = by_responder[responder] = _Mux(nc, responder)
        mux.ready = asyncio.ensure_future(mux.start())
    try:
        await asyncio.shield(mux.ready)
    except Exception:
        by_responder.pop(responder, None)  # the next request subscribes again
        raise
    return mux


async def request(nc: Client, responder: str, subject: str, data: bytes, timeout: float,
                  headers: dict[str, str] | None = None) -> Msg:
    """Send one request on `subject` (built with this connection's `requester(nc)`) and return
    the one answer `responder` sends on this connection's own reply subject. Raises nats-py's
    NoRespondersError (nobody subscribes to `subject`) and TimeoutError, like `nc.request`."""
    mux = await _mux(nc, responder)
    token = _nuid.next().decode()
    fut = asyncio.get_running_loop().create_future()
    mux.waiting[token] = fut
    try:
        await nc.publish(subject, data, reply=f"{mux.prefix}.{token}", headers=headers)
        msg = await asyncio.wait_for(fut, timeout)
    except TimeoutError:
        raise nats.errors.TimeoutError from None
    finally:
        mux.waiting.pop(token, None)
    if (msg.headers or {}).get("Status") == "503":
        raise nats.errors.NoRespondersError
    return msg
