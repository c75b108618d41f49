"""Connecting to NATS: the servers of a cluster, credentials from the settings (each user with
its own inboxes), and the permission violations the server reports, named plainly."""

from __future__ import annotations

import asyncio
import contextlib

import nats
from nats.aio.client import Client

from populace.core import logs
from populace.core.settings import Settings

log = logs.get("populace.bus")  # every part of the bus logs under one name


def servers(url: str) -> list[str]:
    """POPULACE_NATS_URL may list several servers of a cluster, comma-separated."""
    return [u.strip() for u in url.split(",") if u.strip()]


def credentials(settings=None) -> dict:
    """nats-py connect() options from settings (POPULACE_NATS_USER / POPULACE_NATS_PASSWORD),
    if set: the user, its password, and its own inbox prefix (deploy/nats/auth.conf lets each
    user subscribe to `_INBOX_<user>.>` only, so no user reads another's replies)."""
    s = settings or Settings()
    if not s.nats_user:
        return {}
    return {"user": s.nats_user, "password": s.nats_password, "inbox_prefix": inbox_prefix(s.nats_user)}


def inbox_prefix(user: str) -> str:
    return f"_INBOX_{user}"


class PermissionDenied(ConnectionError):
    """The NATS server refused this process's user something it asked (deploy/nats/auth.conf):
    a publish it makes waits for an answer that never comes, so it is named at once instead."""


class _Denials:
    """Permission violations the server reported to connections made by `connect`: how many so
    far and the last (user, error). `until_ready` turns a timeout that came with a new one into
    PermissionDenied."""

    count = 0
    last = ("", "")


denials = _Denials()


def _recording(user: str, error_cb):
    async def on_error(err: Exception) -> None:
        if "permissions violation" in str(err).lower():
            denials.count += 1
            denials.last = (user, str(err))
            log.error("nats_permission_denied", user=user, error=str(err))
        if error_cb is not None:
            await error_cb(err)

    return on_error


def refusal() -> str | None:
    """The last permission NATS refused this process (connections made by `connect`), said
    plainly: a command that timed out says this instead of "cannot reach NATS"."""
    if not denials.count:
        return None
    user, error = denials.last
    return (f"NATS refused user {user!r}: {error.removeprefix('nats: ')} — its grants are in "
            "deploy/nats/auth.conf (deploy/AUTH.md)")


async def connect(url: str, name: str, **kw) -> Client:
    """A nats-py connection that reconnects forever; credentials default to the settings'."""
    opts = {**credentials(), **kw}
    if kw.get("user") and "inbox_prefix" not in kw:  # another user than the settings': its own inboxes
        opts["inbox_prefix"] = inbox_prefix(kw["user"])
    if opts.get("user"):
        opts["error_cb"] = _recording(opts["user"], opts.get("error_cb"))
    return await nats.connect(
        servers(url), name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5, **opts
    )


async def connect_or_fail(url: str, name: str, timeout_s: float = 10.0, refused_s: float = 3.0, **kw) -> Client:
    """For commands, not services: the first connection must succeed within `timeout_s`, else
    ConnectionError naming the URL and nats-py's last error (instead of retrying forever with a
    traceback per attempt). When every try so far was refused (nothing listens at the URL) it
    gives up after `refused_s`: long enough for a server that is starting to listen, not 10 s
    for a URL with a typo. Once connected it reconnects like any service connection."""
    errors: list[Exception] = []
    loop = asyncio.get_running_loop()
    started = loop.time()
    nothing_listens = asyncio.Event()

    async def remember(err: Exception) -> None:
        errors.append(err)
        if loop.time() - started >= refused_s and all(isinstance(e, ConnectionRefusedError) for e in errors):
            nothing_listens.set()

    connecting = asyncio.ensure_future(connect(url, name, error_cb=remember, **kw))
    refused = asyncio.ensure_future(nothing_listens.wait())
    try:
        await asyncio.wait({connecting, refused}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the command itself was cancelled: so is its connect
        connecting.cancel()
        raise
    finally:
        refused.cancel()
    if connecting.done() and connecting.exception() is None:
        return connecting.result()
    err = None if not connecting.done() or connecting.cancelled() else connecting.exception()
    # Cancelled until it is: on Python 3.11 a cancellation that meets nats-py's connect just as
    # one of its attempts fails is lost (asyncio.wait_for's race), and the connect goes on trying.
    while not connecting.done():
        connecting.cancel()
        await asyncio.wait({connecting}, timeout=0.1)
    if not connecting.cancelled() and connecting.exception() is None:  # came up as we gave up
        with contextlib.suppress(Exception):
            await connecting.result().close()
    last = errors[-1] if errors else err or TimeoutError(f"no answer in {timeout_s:g}s")
    raise ConnectionError(f"cannot connect to NATS at {url}: {type(last).__name__}: {last}") from None
