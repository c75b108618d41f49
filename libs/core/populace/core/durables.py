"""A service's durable consumers, kept as it made them: looked up at start and every few seconds,
and re-created — from where they had got to — when one is gone or was changed, with a
`durable_recreated` line saying what was wrong.

Binding to a durable that exists never checks its configuration (nats-py, FastStream), so a
durable whose filter was changed to match nothing (an update keeps its position and the
messages it skipped) would stay so across restarts: the run ends "done" with rows missing and
nothing logged. Only re-creating it from its last acknowledged position gets every message
back, and only its owner knows what it should be."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import NotFoundError

from populace.core import logs

log = logs.get("populace.durables")

# What makes a durable do its job, compared with what its owner asked for: its subjects, how
# it is acknowledged and bounded, and that it is pulled (no deliver subject).
CHECKED = ("filter_subject", "filter_subjects", "ack_policy", "max_deliver", "max_ack_pending", "ack_wait",
           "deliver_subject")


@dataclass
class Durable:
    stream: str
    config: ConsumerConfig  # durable_name and filter_subject set; what else is set is checked too
    last: ConsumerInfo | None = field(default=None, repr=False)  # its last healthy state

    @property
    def name(self) -> str:
        return self.config.durable_name or ""


def wrong(config: ConsumerConfig, want: ConsumerConfig) -> str | None:
    """What differs in `config` from `want` (the fields `want` sets among CHECKED), or None."""
    for name in CHECKED:
        expected, actual = getattr(want, name), getattr(config, name)
        if name == "filter_subjects":
            expected, actual = expected or None, actual or None
        elif expected is None:
            continue
        if name == "ack_wait" and expected is not None and actual is not None:
            expected, actual = round(expected, 3), round(actual, 3)
        if expected != actual:
            return f"{name} is {actual!r}, should be {expected!r}"
    return None


class DurableKeeper:
    def __init__(self, js: JetStreamContext, service: str) -> None:
        self.js, self.service = js, service
        self.durables: list[Durable] = []
        self.recreated = 0
        self._task: asyncio.Task | None = None

    def keep(self, stream: str, config: ConsumerConfig) -> None:
        # named (CONSUMER.CREATE.<stream>.<name>.<filter>): what its owner's NATS user may call
        self.durables.append(Durable(stream, config.evolve(name=config.name or config.durable_name)))

    async def check(self) -> list[str]:
        """Look every durable up; re-create those gone or changed. Returns what was wrong."""
        found: list[str] = []
        for d in self.durables:
            try:
                info = await self.js.consumer_info(d.stream, d.name)
            except NotFoundError:
                info, what = None, "missing"
            else:
                what = wrong(info.config, d.config)
                if what is None:
                    d.last = info
                    continue
            await self._recreate(d, info, what)
            found.append(f"{d.name}: {what}")
        return found

    async def _recreate(self, d: Durable, info: ConsumerInfo | None, what: str) -> None:
        # From its last acknowledged message (its last healthy state's; a changed one keeps the
        # floor it had). Without either it starts as its owner made it (as at a first start).
        base = d.last or info
        floor = base.ack_floor.stream_seq if base is not None and base.ack_floor is not None else None
        config = d.config
        if d.last is not None:
            config = d.last.config.evolve(**{k: getattr(d.config, k) for k in CHECKED
                                             if getattr(d.config, k) is not None})
        if floor is not None:
            config = config.evolve(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=floor + 1,
                                   opt_start_time=None)
        if info is not None:  # an update would keep the position it has (and what it skipped)
            with contextlib.suppress(NotFoundError):
                await self.js.delete_consumer(d.stream, d.name)
        d.last = await self.js.add_consumer(d.stream, config)
        self.recreated += 1
        log.error("durable_recreated", service=self.service, stream=d.stream, durable=d.name, wrong=what,
                  from_seq=floor + 1 if floor is not None else None)

    def start(self, every_s: float) -> None:
        self._task = asyncio.create_task(self._watch(every_s))

    async def _watch(self, every_s: float) -> None:
        while True:
            try:
                await self.check()
            except Exception as err:  # the bus is away (a reconnect): looked at again next time
                log.warning("durable_check_failed", service=self.service, error=f"{type(err).__name__}: {err}")
            await asyncio.sleep(every_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
