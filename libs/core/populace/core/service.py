"""The frame every service shares: a FastStream app on a NatsBroker, structlog, stream and
KV provisioning at start-up, a liveness entry in KV `services`, and one decorator for every
handler (`@svc.handle(subject, Model)`): parse the wire model, dead-letter a malformed
message once, run the handler in the message's trace context. A handler that raises
`Refused` has its message dead-lettered at once; one that raises anything else on JetStream
gets it again after a growing delay, and dead-lettered after MAX_DELIVERIES.

Services are built by a factory (`create(settings) -> Service`) and keep no module-level
state, so tests, the Python API and a web manager can build several in one process.
`faststream run populace.<service>.app:create --factory` and `faststream docs gen … --factory`
work as for any FastStream app; the AsyncAPI document shows every subject with its model."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from importlib import metadata
from typing import Any, TypeVar

from faststream import FastStream
from faststream.exceptions import HandlerException, NackMessage, RejectMessage
from faststream.nats import NatsBroker, NatsUserPassword, PullSub
from faststream.nats.annotations import NatsMessage
from faststream.specification import AsyncAPI
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from opentelemetry import context as otel_context
from pydantic import BaseModel, ValidationError

from populace.core import bus, logs, metrics, replies, subjects, telemetry
from populace.core.contracts import ServiceInfo
from populace.core.durables import DurableKeeper
from populace.core.settings import Settings

M = TypeVar("M", bound=BaseModel)
ORPHAN_GRACE_S = 10.0
# A JetStream message whose handler keeps failing is redelivered with a growing delay, then
# dead-lettered with its error: never a hot loop, never an unbounded log. Ten deliveries span
# about two minutes, longer than a stream leader election or a short broker outage.
MAX_DELIVERIES = 10
# Control-plane pull consumers (run starts, partials, round results …) fetch one message at a
# time. nats-py's fetch(batch=n > 1) hands a message that arrived during its long poll back only
# once n have come or the poll's 5 s expired: with two hosts' partials the environment closed
# every round on its fetch loop's 5 s grid (1M-agent rounds ended at exactly 10.00 s). These
# are a few messages per host and round, so a fetch each costs nothing.
def control_pull() -> PullSub:
    return PullSub(batch_size=1)


RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)


async def keep_in_progress(msgs: list[Msg], ack_wait_s: float) -> None:
    """While JetStream messages are being handled (a durable's message, the recorder's fetch),
    tell JetStream every third of their ack wait that they are: no redelivery to another process
    meanwhile. Run it as a task; cancel it once they are settled."""
    while True:
        await asyncio.sleep(ack_wait_s / 3)
        # one settled meanwhile, or the connection going: nothing to keep
        await asyncio.gather(*(m.in_progress() for m in msgs), return_exceptions=True)


class Refused(Exception):
    """Raised by a handler for a message that can never succeed (a run this stack does not
    know): dead-lettered once with the reason, never retried. Anything else a handler raises
    is taken as transient and retried (`Service.failed`)."""


def retry_delay(delivered: int, delays: tuple[float, ...] = RETRY_DELAYS_S) -> float:
    """The delay before delivery `delivered + 1` of a message whose handler failed."""
    return delays[min(max(delivered, 1), len(delays)) - 1]


def _version() -> str:
    try:
        return metadata.version("populace-core")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a plain checkout
        return "0"


class Service:
    def __init__(self, name: str, settings: Settings | None = None, description: str = "") -> None:
        self.name = name
        self.settings = settings or Settings()
        logs.configure(self.settings.log_level, self.settings.log_format, service=name)
        telemetry.setup(name)
        metrics.declare(name)  # its series exist (at 0) before its first round, batch or bad message
        self.log = logs.get(f"populace.{name}")
        quiet = logging.getLogger(f"faststream.{name}")
        quiet.setLevel(logging.WARNING)
        creds = bus.credentials(self.settings)
        self.inbox_prefix: str | None = creds.get("inbox_prefix")
        self.broker = NatsBroker(
            bus.servers(self.settings.nats_url), logger=quiet, log_level=logging.DEBUG,
            max_reconnect_attempts=-1, reconnect_time_wait=0.5, name=f"populace-{name}",
            security=NatsUserPassword(creds["user"], creds["password"]) if creds else None,
            **({"inbox_prefix": creds["inbox_prefix"]} if creds else {}),
        )
        # Never connected: it only describes, for the AsyncAPI document, what the service
        # publishes and what it consumes outside FastStream (the recorder's own pull loop).
        self.docs = NatsBroker(logger=quiet)
        self.app = FastStream(self.broker, logger=quiet, specification=AsyncAPI(
            self.broker, self.docs, title=f"populace {name}", version=_version(),
            description=description or None))
        self.app.on_startup(self._connect_and_provision)
        self.app.after_startup(self._register)
        self.app.on_shutdown(self._unregister)
        self._heartbeat: bus.Heartbeat | None = None
        # Its liveness entry's key in KV `services`, `<service>.<…>`: each service's NATS user
        # may write keys under its own name only (an agent-host's user: its own host id's).
        self.instance = f"{name}.{os.getpid()}"
        self.durables = DurableKeeper(None, name)  # type: ignore[arg-type]  # its js once connected
        self.max_deliveries, self.retry_delays_s = MAX_DELIVERIES, RETRY_DELAYS_S
        self._startup_hooks: list[Callable[[], Awaitable[None]]] = []
        self._shutdown_hooks: list[Callable[[], Awaitable[None]]] = []

    # -- lifecycle --------------------------------------------------------------------
    def on_ready(self, fn: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        self._startup_hooks.append(fn)
        return fn

    def on_stop(self, fn: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        self._shutdown_hooks.append(fn)
        return fn

    @property
    def nc(self):
        return self.broker.connection

    async def _connect_and_provision(self) -> None:
        # A restarted container keeps its /tmp: the health file of the process before would say
        # `healthy` while this one is not connected yet (compose up --wait returned early)
        bus.forget_alive(self.settings.health_file)
        # an exception no code waits for is still one error line with its cause, and counted
        logs.watch_unobserved(metrics.UNOBSERVED.labels(self.name).inc)
        await self.broker.connect()
        self.js = self.nc.jetstream(publish_async_max_pending=self.settings.publish_async_max_pending)
        await bus.provision(self.js, storage=self.settings.storage, replicas=self.settings.stream_replicas,
                            **bus.stream_limits(self.settings))

    async def _register(self) -> None:
        # Metrics first: a process that cannot serve them (port taken) never registers as ready.
        metrics.serve(self.settings.metrics_port)
        for fn in self._startup_hooks:
            await fn()
        kv = await self.js.key_value(subjects.SERVICES_BUCKET)
        instance = self.instance
        self._heartbeat = bus.Heartbeat(
            kv, instance,
            lambda: ServiceInfo(service=self.name, instance=instance, pid=os.getpid(),
                                heartbeat_at=time.time()),
            self.settings.heartbeat_s, alive_file=self.settings.health_file,
        )
        await self._heartbeat.start()
        if self.durables.durables:  # at start, then every few seconds
            self.durables.js = self.js
            self.durables.start(self.settings.durable_check_s)
        if self.settings.parent_pid:
            # in this context, so its log lines name the service (a one-process stack's contexts differ)
            threading.Thread(target=contextvars.copy_context().run,
                             args=(self._exit_when_orphaned, self.settings.parent_pid),
                             name=f"{self.name}-orphan-watch", daemon=True).start()
        self.log.info("service_ready", nats=self.settings.nats_url)

    def _exit_when_orphaned(self, parent_pid: int) -> None:
        """A service started by `populace demo/up/bench` stops when that command dies,
        so a killed command never leaves services holding ports or the DuckDB file. A daemon
        thread, not a task of the event loop: it must act when the loop cannot. A launcher's
        SIGKILL also sends the services SIGTERM (PR_SET_PDEATHSIG) and takes nats-server down
        with it, so their graceful shutdown may hang on a bus that is gone; a task cancelled or
        starved by that shutdown, or an interpreter waiting at exit on a stuck thread, left a
        service running on a loaded machine (a clean-clone CI run, 2026-12-05)."""
        while os.getppid() == parent_pid:  # nothing signals a parent's death to a thread; we poll it
            time.sleep(1.0)
        self.log.warning("parent_exited", parent_pid=parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)
        # If graceful shutdown hangs (work in flight that nobody will ever read), leave anyway:
        # an orphan must never keep burning CPU or holding files.
        time.sleep(ORPHAN_GRACE_S)
        self.log.error("shutdown_hung_exiting", grace_s=ORPHAN_GRACE_S)
        os._exit(1)

    async def _unregister(self) -> None:
        for fn in self._shutdown_hooks:
            try:
                await fn()
            except Exception as err:
                self.log.warning("shutdown_hook_failed", error=str(err))
        await self.durables.stop()
        if self._heartbeat:
            await self._heartbeat.stop()
        telemetry.shutdown()

    # -- messages ---------------------------------------------------------------------
    def handle(self, subject: str, model: type[M], *, reply_on_error: Callable[[str], BaseModel] | None = None,
               answers: bool = False, **subscriber: Any) -> Callable:
        """Register `fn(event)` (or `fn(event, msg)`) for `subject`, typed by `model` so the
        AsyncAPI document shows its schema. A message that is not a valid `model` never reaches
        `fn`: it is dead-lettered once (logged, counted, copied to dlq.<service>, terminated on
        JetStream). `fn` runs in the message's trace context, so its spans continue the sender's
        trace. Other keyword arguments go to FastStream's `broker.subscriber`.

        `answers`: `subject` takes requests (its last token names the requester, see
        populace.core.replies). A request whose reply subject is not the requester's own is
        dead-lettered and never answered; otherwise what `fn` returns (bytes or a model; None:
        nothing, `fn` answers later itself) is published on the reply subject, and a malformed
        request gets `reply_on_error(reason)` there."""
        if reply_on_error is not None and not answers:
            raise ValueError("reply_on_error is for handlers that answer requests (answers=True)")

        def decorate(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            with_msg = len(inspect.signature(fn).parameters) > 1

            async def decoder(msg: NatsMessage, original: Any = None) -> M:
                raw = msg.raw_message
                if answers and (why := replies.refusal(self.name, raw.subject, raw.reply)):
                    await self.dead_letter(raw, why, terminate=False)
                    raise RejectMessage() from None
                try:
                    return model.model_validate_json(raw.data)
                except ValidationError as err:
                    await self.dead_letter(raw, err, terminate=False)  # RejectMessage terminates it
                    if reply_on_error is not None:
                        await self.answer(raw, reply_on_error(bus.short_error(err)))
                    raise RejectMessage() from None

            durable = bool(subscriber.get("durable"))

            async def handler(event: M, msg: NatsMessage) -> Any:
                token = otel_context.attach(telemetry.extract(msg.headers))
                beat = (asyncio.create_task(keep_in_progress([msg.raw_message], self.settings.ack_wait_s))
                        if durable else None)
                try:
                    result = await (fn(event, msg) if with_msg else fn(event))
                    if answers:
                        await self.answer(msg.raw_message, result)
                        return None
                    return result
                except HandlerException:
                    raise
                except Refused as err:
                    await self.dead_letter(msg.raw_message, str(err), terminate=False)
                    raise RejectMessage() from err
                except Exception as err:
                    raise await self.failed(msg.raw_message, err) from err
                finally:
                    if beat is not None:
                        beat.cancel()
                    otel_context.detach(token)

            handler.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
                inspect.Parameter("event", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=model),
                inspect.Parameter("msg", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=NatsMessage)])
            handler.__name__, handler.__doc__ = fn.__name__, fn.__doc__
            if durable:
                # The server's own bound, past ours: a message that kills the process before its
                # handler can settle it (so our count never acts) still stops coming. Its ack wait
                # is how soon a killed process's message reaches its successor (settings.ack_wait_s).
                subscriber.setdefault("config", ConsumerConfig(filter_subjects=[],
                                                               max_deliver=self.max_deliveries + 2,
                                                               ack_wait=self.settings.ack_wait_s))
                stream = subscriber.get("stream")
                self.durables.keep(getattr(stream, "name", stream), ConsumerConfig(
                    durable_name=subscriber["durable"], filter_subject=subject, ack_policy=AckPolicy.EXPLICIT,
                    deliver_policy=subscriber.get("deliver_policy") or DeliverPolicy.ALL,
                    max_deliver=subscriber["config"].max_deliver, ack_wait=subscriber["config"].ack_wait))
            if self.inbox_prefix and subscriber.get("stream") is not None:
                # FastStream gives JetStream subscriptions nats-py's default `_INBOX.`, not the
                # connection's: the user's own prefix, the only inboxes it may read
                subscriber.setdefault("inbox_prefix", f"{self.inbox_prefix}.".encode())
            # Never FastStream's own reply: it publishes a handler's return (None included: an
            # empty message) on the message's reply subject, which for a JetStream message is a
            # `reply_to` header its publisher writes. A host's spawned report with `reply_to:
            # $KV.runs.<rid>` had the orchestrator blank the run's state. Requests are answered
            # by self.answer, on a checked reply subject only.
            subscriber["no_reply"] = True
            subscriber.setdefault("title", subjects.doc_title(subject))
            subscriber.setdefault("description", inspect.getdoc(fn))
            self.broker.subscriber(subject, decoder=decoder, **subscriber)(handler)
            return fn

        return decorate

    async def answer(self, raw: Msg, reply: bytes | BaseModel | None) -> None:
        """Publish the answer to a request on its reply subject, which `handle(answers=True)`
        checked was the requester's own before the request reached its handler."""
        if reply is None or not raw.reply:
            return
        await self.nc.publish(raw.reply, reply if isinstance(reply, bytes) else bus.encode(reply))

    async def failed(self, raw: Msg, err: Exception) -> HandlerException:
        """A handler raised. On JetStream the message comes again after a growing delay (a
        transient failure, e.g. a leader election, heals), and after MAX_DELIVERIES it is
        dead-lettered with the error; on core NATS nothing comes again, and the error is logged
        once. Returns the FastStream exception that settles the message accordingly."""
        if not bus.is_jetstream(raw):  # nothing comes again: one line, with the traceback
            self.log.error("handler_failed", subject=raw.subject, error=f"{type(err).__name__}: {err}", exc_info=err)
            return RejectMessage()
        delay = await self.retry_later(raw, err)
        return RejectMessage() if delay is None else NackMessage(delay=delay)

    async def retry_later(self, raw: Msg, err: Exception) -> float | None:
        """The policy for a JetStream message whose handling failed: the delay before it comes
        again (logged), or None once it came `max_deliveries` times: then it is dead-lettered
        with the error (and terminated), once."""
        error = f"{type(err).__name__}: {err}"
        delivered = raw.metadata.num_delivered or 1
        if delivered >= self.max_deliveries:
            await self.dead_letter(raw, f"handler failed {delivered} times, last: {error}")
            return None
        delay = retry_delay(delivered, self.retry_delays_s)
        self.log.warning("handler_failed_retrying", subject=raw.subject, delivery=delivered, retry_in_s=delay,
                         error=error)
        return delay

    def publishes(self, subject: str, model: type[BaseModel], description: str = "") -> None:
        """Document a subject this service publishes (with its payload model) in AsyncAPI."""
        self.docs.publisher(subject, schema=model, title=subjects.doc_title(subject),
                            description=description or None)

    def consumes(self, subject: str, model: type[BaseModel], description: str = "") -> None:
        """Document a subject this service consumes outside `handle` (its own loop)."""

        async def documented(event: Any) -> None:  # pragma: no cover - never subscribed
            return None

        documented.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
            inspect.Parameter("event", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=model)])
        self.docs.subscriber(subject, title=subjects.doc_title(subject),
                             description=description or None)(documented)

    async def parse(self, model: type[M], msg: Msg) -> M | None:
        """Validate a message; a malformed one is dead-lettered and None is returned."""
        try:
            return model.model_validate_json(msg.data)
        except ValidationError as err:
            await self.dead_letter(msg, err)
            return None

    async def dead_letter(self, msg: Msg, error: Exception | str, terminate: bool = True) -> None:
        """Log, count, terminate (JetStream) and dead-letter a refused message to dlq.<service>:
        its reference (subject, stream and sequence if stored, size, sender, reason) in headers
        and at most bus.DLQ_EXCERPT_BYTES of it, never an unbounded copy (a flood of large junk
        must not be stored twice). Never raises: a bad message must not take a service down."""
        reason = bus.short_error(error)
        bus.dlq_counts[self.name] += 1
        metrics.DEAD_LETTERS.labels(self.name).inc()
        data = msg.data or b""
        sender = subjects.sender_of(msg.subject)
        self.log.warning("dead_letter", subject=msg.subject, sender=sender, error=reason, bytes=len(data),
                         dlq_total=bus.dlq_counts[self.name])
        if terminate and bus.is_jetstream(msg) and not msg._ackd:
            try:
                await msg.term()
            except Exception as err:
                self.log.warning("dead_letter_term_failed", error=str(err))
        try:
            await self.broker.publish(data[:bus.DLQ_EXCERPT_BYTES], subjects.dlq(self.name),
                                      headers=bus.dlq_headers(msg, reason, self.instance))
        except Exception as err:
            self.log.error("dead_letter_publish_failed", error=str(err))
