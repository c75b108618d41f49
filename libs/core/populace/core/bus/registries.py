"""Registries in TTL'd KV buckets (hosts, services, replicas, nodes): keeping an entry alive, and
reading the live ones; and the newest message stored on a subject."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ValidationError

from populace.core import logs
from populace.core.bus.connection import connect
from populace.core.bus.publishing import encode
from populace.core.bus.retries import until_ready

M = TypeVar("M", bound=BaseModel)
log = logs.get("populace.bus")  # every part of the bus logs under one name


def _touch(path: str) -> None:
    """A file's time set to now (created if need be): microseconds, on a local file."""
    Path(path).touch()


def forget_alive(path: str | None) -> None:
    """No health file at `path` (a process that does not beat, or not yet, is not healthy):
    microseconds, on a local file."""
    if path:
        Path(path).unlink(missing_ok=True)


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
        forget_alive(self._alive_file)  # a process that stopped beating is not healthy, whatever comes next
        if delete:
            try:
                await self._kv.delete(self._key)
            except Exception:
                pass


class ThreadHeartbeat:
    """Keeps a registry entry alive from a thread of its own, with its own event loop and NATS
    connection: nothing the process's main loop runs — a simulation's code that holds it for a
    minute — can stop it, so the entry goes stale only when the process is gone (or cannot reach
    NATS). `payload(busy_s)` builds the entry (in that thread: it must only read plain values),
    given how long the main loop has not turned: a main loop held for good keeps its process
    registered, and shows as that figure and as a round without progress — which the orchestrator
    pauses, naming it — never as a lost host whose agents would be placed again, to be held the
    same way elsewhere."""

    def __init__(self, url: str, bucket: str, key: str, payload: Callable[[float], BaseModel], every_s: float,
                 *, name: str, connect_kw: dict | None = None) -> None:
        self._url, self._bucket, self._key, self._payload, self._every = url, bucket, key, payload, every_s
        self._name, self._connect_kw = name, connect_kw or {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the thread's
        self._main: asyncio.AbstractEventLoop | None = None  # the process's, whose turns it watches
        self._started: concurrent.futures.Future = concurrent.futures.Future()
        self._stopping: asyncio.Event | None = None
        self._delete = True
        self._kv: KeyValue | None = None
        self._asked_at = time.monotonic()  # when the main loop was last asked to say it turns
        self._answered = True  # it said so since

    async def start(self) -> None:
        """Start the thread; returns once NATS took the first heartbeat (raises what stopped it)."""
        self._main = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self._key}", daemon=True)
        self._thread.start()
        await asyncio.wrap_future(self._started)

    def busy_s(self) -> float:
        """How long the main loop has not turned, as of now (0: it turns)."""
        return 0.0 if self._answered else time.monotonic() - self._asked_at

    def _turned(self) -> None:  # on the main loop
        self._answered = True

    def _ask_main(self) -> float:
        """The main loop's busy seconds for this beat, and a new question for the next."""
        busy = self.busy_s()
        if self._answered:
            self._answered, self._asked_at = False, time.monotonic()
            try:
                self._main.call_soon_threadsafe(self._turned)  # type: ignore[union-attr]
            except RuntimeError:  # the main loop is closed: the process is going
                pass
        return busy

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as err:
            if not self._started.done():
                self._started.set_exception(err)
            else:
                log.error("heartbeat_thread_failed", key=self._key, error=f"{type(err).__name__}: {err}")

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        nc = await connect(self._url, self._name, **self._connect_kw)
        try:
            js = nc.jetstream()
            self._kv = await until_ready(lambda: js.key_value(self._bucket), f"bucket {self._bucket}")
            await until_ready(self._beat, f"first heartbeat of {self._key}")
            self._started.set_result(None)
            while not self._stopping.is_set():
                try:
                    await asyncio.wait_for(self._stopping.wait(), self._every)
                except TimeoutError:
                    await self._beat_logged()
            if self._delete:
                try:
                    await self._kv.delete(self._key)
                except Exception:
                    pass
        finally:
            await nc.close()

    async def _beat(self) -> None:
        await self._kv.put(self._key, encode(self._payload(self._ask_main())))  # type: ignore[union-attr]

    async def _beat_logged(self) -> None:
        try:
            await self._beat()
        except Exception as err:
            log.warning("heartbeat_failed", key=self._key, error=str(err))

    async def beat_now(self) -> None:
        """One heartbeat now (from the main loop), between the regular ones."""
        if self._loop is None or self._stopping is None or self._stopping.is_set():
            return
        try:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._beat_logged(), self._loop))
        except RuntimeError:  # its loop ended meanwhile
            pass

    async def stop(self, delete: bool = True) -> None:
        self._delete = delete
        if self._loop is not None and self._stopping is not None:
            try:
                self._loop.call_soon_threadsafe(self._stopping.set)
            except RuntimeError:
                pass
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)


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
    return [item for _, item in await registry_items(js, bucket, model, fresh_within_s, strict)]


async def registry_items(js: JetStreamContext, bucket: str, model: type[M],
                         fresh_within_s: float | None = None, strict: bool = False) -> list[tuple[str, M]]:
    """(key, entry) of each current entry, as registry_entries reads them: for a reader that
    needs to know under which key (and so by whom: populace.core.replica_hosts) an entry was
    written."""
    kv = await js.key_value(bucket)
    try:
        keys = await bucket_keys(js, bucket)
    except Exception:
        if strict:
            raise
        return []
    now = time.time()
    out: list[tuple[str, M]] = []
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
            out.append((key, item))
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
