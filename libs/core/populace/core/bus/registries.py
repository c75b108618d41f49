"""Registries in TTL'd KV buckets (hosts, services, replicas, nodes): keeping an entry alive, and
reading the live ones; and the newest message stored on a subject."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import TypeVar

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ValidationError

from populace.core import logs
from populace.core.bus.publishing import encode
from populace.core.bus.retries import until_ready

M = TypeVar("M", bound=BaseModel)
log = logs.get("populace.bus")  # every part of the bus logs under one name


def _touch(path: str) -> None:
    """A file's time set to now (created if need be): microseconds, on a local file."""
    Path(path).touch()


class Heartbeat:
    """Keeps a registry entry alive in a TTL'd KV bucket until stopped. `alive_file`: a file
    touched after every heartbeat NATS took, for a container's healthcheck (its age says
    whether the process is connected and its event loop turns)."""

    def __init__(self, kv: KeyValue, key: str, payload, every_s: float, alive_file: str | None = None) -> None:
        self._kv, self._key, self._payload, self._every = kv, key, payload, every_s
        self._alive_file = alive_file
        self._task: asyncio.Task | None = None
        self._stopped = False  # a beat after stop() would bring back the entry it deleted

    async def start(self) -> None:
        await until_ready(self._beat, f"first heartbeat of {self._key}")
        self._task = asyncio.create_task(self._loop())

    async def _beat(self) -> None:
        await self._kv.put(self._key, encode(self._payload()))
        if self._alive_file:
            _touch(self._alive_file)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            await self.beat_now()

    async def beat_now(self) -> None:
        """One heartbeat now, between the regular ones: what it says changed (a host's agents
        went, so its room is free) and should not wait for the next."""
        if self._stopped:
            return
        try:
            await self._beat()
        except Exception as err:
            log.warning("heartbeat_failed", key=self._key, error=str(err))

    async def stop(self, delete: bool = True) -> None:
        self._stopped = True
        if self._task:
            self._task.cancel()
        if delete:
            try:
                await self._kv.delete(self._key)
            except Exception:
                pass


# The most subjects one stream-info answer lists (nats-server's JSMaxSubjectDetails); past it the
# answer is paged by an offset into the sorted subjects.
SUBJECTS_LISTED = 100_000


async def stream_subjects(js: JetStreamContext, stream: str, subjects_filter: str) -> dict[str, int]:
    """The subjects of `stream` that match `subjects_filter`, with how many messages each holds,
    from stream-info requests (one per 100,000 subjects): a reader needs only the stream-info
    grant that binding a bucket takes."""
    found: dict[str, int] = {}
    while True:
        # nats-py's stream_info cannot ask for an offset: the JetStream API request it makes,
        # with one (JSApiStreamInfoRequest's `offset`), through its own request helper
        answer = await js._api_request(f"{js._prefix}.STREAM.INFO.{stream}",
                                       json.dumps({"subjects_filter": subjects_filter, "offset": len(found)}).encode(),
                                       timeout=js._timeout)
        page = (answer.get("state") or {}).get("subjects") or {}
        found.update(page)
        if not page or len(found) >= answer.get("total", 0):
            return found


async def bucket_keys(js: JetStreamContext, bucket: str) -> list[str]:
    """The keys of a KV bucket as the server holds them now, from stream-info requests (the
    bucket's subjects, one request per 100,000). Not nats-py's kv.keys(): its watcher ends the
    listing at the first entry that reports nothing pending, which under concurrent writes
    (every host heartbeating) comes before the listing is complete (nats-io/nats.py#995); a run
    was placed on two of three live hosts that way. And a reader needs no consumer on the bucket,
    only the stream-info grant that binding it takes. A deleted key's subject is still listed;
    reading its value says it is gone."""
    prefix = f"$KV.{bucket}."
    return [subject[len(prefix):] for subject in await stream_subjects(js, f"KV_{bucket}", f"{prefix}>")]


async def registry_entries(js: JetStreamContext, bucket: str, model: type[M],
                           fresh_within_s: float | None = None, strict: bool = False) -> list[M]:
    """Current entries of a registry bucket, skipping stale or malformed ones (entries without
    a `heartbeat_at`, such as run states, are never stale).

    `strict`: a failed read (e.g. during a leader election) raises instead of looking like an
    empty registry. A caller that acts on *absence* (declaring a host lost) must use it."""
    kv = await js.key_value(bucket)
    try:
        keys = await bucket_keys(js, bucket)
    except Exception:
        if strict:
            raise
        return []
    now = time.time()
    out: list[M] = []
    for key in keys:
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            continue  # deleted meanwhile
        except Exception:
            if strict:
                raise
            continue
        try:
            item = model.model_validate_json(entry.value)
        except ValidationError:
            continue  # malformed: not a live entry
        hb = getattr(item, "heartbeat_at", now)
        if fresh_within_s is None or now - hb <= fresh_within_s:
            out.append(item)
    return out


async def last_on(js: JetStreamContext, stream: str, subject: str, model: type[M]) -> M | None:
    """The newest message stored on `subject` in `stream`, parsed (None: none, or malformed)."""
    try:
        msg = await until_ready(lambda: js.get_last_msg(stream, subject), f"last message on {subject}")
    except NotFoundError:
        return None
    try:
        return model.model_validate_json(msg.data or b"")
    except ValidationError:
        return None
