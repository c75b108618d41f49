"""NATS / JetStream helpers shared by every service: provisioning, publishing, dead letters,
registries. FastStream owns each service's subscriptions; hot paths use the nats-py client
FastStream already holds (`broker.connection`) because FastStream awaits one PubAck per
JetStream publish and has no batch publish."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import time
from collections import Counter
from pathlib import Path
from typing import TypeVar

import nats
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, ObjectStoreConfig, StorageType, StreamConfig
from nats.js.errors import (
    APIError,
    BadRequestError,
    BucketNotFoundError,
    KeyNotFoundError,
    NoKeysError,
    NoStreamResponseError,
    NotFoundError,
    ServiceUnavailableError,
)
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore
from pydantic import BaseModel, ValidationError
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from populace.core import admission, logs, runconfigs, subjects, telemetry
from populace.core.contracts import RoundOpen, RunHead, RunState

M = TypeVar("M", bound=BaseModel)
log = logs.get("populace.bus")

# Malformed messages seen by this process, by service (dead-lettered).
dlq_counts: Counter[str] = Counter()


def encode(model: BaseModel) -> bytes:
    return model.model_dump_json().encode()


def servers(url: str) -> list[str]:
    """POPULACE_NATS_URL may list several servers of a cluster, comma-separated."""
    return [u.strip() for u in url.split(",") if u.strip()]


def credentials(settings=None) -> dict:
    """nats-py connect() options from settings (POPULACE_NATS_USER / POPULACE_NATS_PASSWORD),
    if set: the user, its password, and its own inbox prefix (deploy/nats/auth.conf lets each
    user subscribe to `_INBOX_<user>.>` only, so no user reads another's replies)."""
    from populace.core.settings import Settings

    s = settings or Settings()
    if not s.nats_user:
        return {}
    return {"user": s.nats_user, "password": s.nats_password, "inbox_prefix": inbox_prefix(s.nats_user)}


def inbox_prefix(user: str) -> str:
    return f"_INBOX_{user}"


def seal(conn, msg_id: str) -> str:
    """A JetStream de-duplication id other users cannot predict. De-duplication is stream-wide,
    whatever the subject: a user who guessed another's next id could publish it first, on a
    subject of its own, and JetStream would drop the real message as a duplicate. So the id
    carries an HMAC of itself keyed by the publisher's NATS password (`conn`: its Client or
    JetStreamContext): each user has its own, and a restarted process the same, so a retried
    publish is still de-duplicated. On an open bus (no password) the id stays as it is."""
    nc = getattr(conn, "_nc", conn)  # nats-py keeps the JetStreamContext's connection there
    password = (getattr(nc, "options", None) or {}).get("password")
    if not password:
        return msg_id
    mac = hmac.new(password.encode(), msg_id.encode(), hashlib.sha256).hexdigest()[:16]
    return f"{msg_id}.{mac}"


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


async def connect_or_fail(url: str, name: str, timeout_s: float = 10.0, **kw) -> Client:
    """For commands, not services: the first connection must succeed within `timeout_s`, else
    ConnectionError naming the URL and nats-py's last error (instead of retrying forever with a
    traceback per attempt). Once connected it reconnects like any service connection."""
    errors: list[str] = []

    async def remember(err: Exception) -> None:
        errors.append(f"{type(err).__name__}: {err}")

    try:
        return await asyncio.wait_for(connect(url, name, error_cb=remember, **kw), timeout_s)
    except Exception as err:
        last = errors[-1] if errors else f"{type(err).__name__}: {err}"
        raise ConnectionError(f"cannot connect to NATS at {url}: {last}") from None


class StreamLimitError(RuntimeError):
    """A stream's retention limits are more than the NATS server can give it."""


def _storage(kind: str) -> StorageType:
    return StorageType.MEMORY if kind == "memory" else StorageType.FILE


# Retention of RUN and DLQ, when a service creates them (services may not update streams: an
# existing stream keeps its limits; `nats stream edit` as `admin` changes them). RUN refuses new
# events once full (DiscardPolicy.NEW: a publish fails loudly, never an unrecorded event dropped
# in silence); DLQ drops its oldest dead letters (each was logged when it was refused).
RUN_MAX_AGE_S = 30 * 86400.0
RUN_MAX_BYTES = {"file": 16 * 2**30, "memory": 2 * 2**30}  # a memory stream's bytes are reserved in RAM
DLQ_MAX_AGE_S = 7 * 86400.0
DLQ_MAX_BYTES = 256 * 2**20
# nats-server refuses a stream whose byte limit it cannot reserve (its default JetStream storage
# is 75% of the free disk or RAM): a default limit is then halved until it fits, down to this.
INSUFFICIENT_RESOURCES = (10028, 10047)  # memory, storage
MIN_DEFAULT_BYTES = 16 * 2**20


def stream_limits(settings) -> dict:
    """provision()'s retention arguments from the settings (POPULACE_RUN_MAX_AGE_S …)."""
    return {"run_max_age_s": settings.run_max_age_s, "run_max_bytes": settings.run_max_bytes,
            "dlq_max_age_s": settings.dlq_max_age_s, "dlq_max_bytes": settings.dlq_max_bytes}


async def provision(js: JetStreamContext, storage: str = "file", replicas: int = 1,
                    run_max_age_s: float = RUN_MAX_AGE_S, run_max_bytes: int | None = None,
                    dlq_max_age_s: float = DLQ_MAX_AGE_S, dlq_max_bytes: int | None = None) -> None:
    """Create the CTL/RUN/DLQ streams and the KV buckets if missing. Safe to call from
    every service at start-up, concurrently. RUN and DLQ are bounded by age and bytes
    (`run_max_age_s` 0: no age limit; a byte limit None: the default for the storage, lowered
    if the server cannot reserve it); the limits are set only when a stream is created here
    (services may not update streams)."""
    st = _storage(storage)
    streams = [  # DLQ before RUN: the small one reserved first, RUN fits itself in the rest
        (StreamConfig(name=subjects.CTL_STREAM, subjects=subjects.CTL_SUBJECTS, storage=st,
                      num_replicas=replicas, duplicate_window=120.0), None, False),
        (StreamConfig(name=subjects.DLQ_STREAM, subjects=subjects.DLQ_SUBJECTS, storage=st,
                      num_replicas=replicas, max_msgs=100_000, max_age=dlq_max_age_s,
                      max_bytes=dlq_max_bytes or DLQ_MAX_BYTES, discard=DiscardPolicy.OLD),
         "POPULACE_DLQ_MAX_BYTES", dlq_max_bytes is None),
        (StreamConfig(name=subjects.RUN_STREAM, subjects=subjects.RUN_SUBJECTS, storage=st,
                      num_replicas=replicas, duplicate_window=120.0,
                      max_msg_size=8 * 1024 * 1024, max_age=run_max_age_s or None,
                      max_bytes=run_max_bytes or RUN_MAX_BYTES["memory" if st == StorageType.MEMORY else "file"],
                      discard=DiscardPolicy.NEW),
         "POPULACE_RUN_MAX_BYTES", run_max_bytes is None),
    ]
    for cfg, setting, by_default in streams:
        while True:
            try:
                await until_ready(lambda cfg=cfg: _ensure_stream(js, cfg), f"stream {cfg.name}", PROVISION_ATTEMPTS)
                break
            except APIError as err:
                if err.err_code not in INSUFFICIENT_RESOURCES or setting is None:
                    raise
                if not by_default or cfg.max_bytes // 2 < MIN_DEFAULT_BYTES:
                    raise StreamLimitError(
                        f"stream {cfg.name}: the NATS server cannot reserve its byte limit of {cfg.max_bytes} bytes "
                        f"({err.description}); lower {setting}, or give the server more JetStream "
                        f"{cfg.storage.value} storage") from None
                log.warning("stream_limit_lowered", stream=cfg.name, refused_bytes=cfg.max_bytes,
                            trying_bytes=cfg.max_bytes // 2, setting=setting)
                cfg = dataclasses.replace(cfg, max_bytes=cfg.max_bytes // 2)
    for bucket, ttl in (
        (subjects.RUNS_BUCKET, None),
        (subjects.HOSTS_BUCKET, 30.0),
        (subjects.SERVICES_BUCKET, 30.0),
        (subjects.REPLICAS_BUCKET, 30.0),
    ):
        await until_ready(lambda b=bucket, t=ttl: ensure_kv(js, b, ttl=t, storage=st, replicas=replicas),
                          f"bucket {bucket}", PROVISION_ATTEMPTS)
    for bucket, rollups in ((subjects.PERSONAS_BUCKET, True), (subjects.CHECKPOINTS_BUCKET, False),
                            (subjects.GRAPHS_BUCKET, True)):
        await until_ready(lambda b=bucket, r=rollups: ensure_object_store(js, b, storage=st, replicas=replicas,
                                                                          rollups=r),
                          f"object store {bucket}", PROVISION_ATTEMPTS)


# KV `nodes` is provisioned by the nodes alone (readers treat a missing bucket as no nodes):
# in provision() it would cost every service's NATS user two more JetStream API grants.
NODES_TTL_S = 30.0


async def provision_nodes(js: JetStreamContext, storage: str = "file", replicas: int = 1) -> KeyValue:
    """Create KV `nodes` if missing (TTL'd like the other registries) and return it."""
    return await until_ready(lambda: ensure_kv(js, subjects.NODES_BUCKET, ttl=NODES_TTL_S, storage=_storage(storage),
                                               replicas=replicas), f"bucket {subjects.NODES_BUCKET}",
                             PROVISION_ATTEMPTS)


# Snapshots (a DuckDB file per reader of a live run) are fetched at once; the TTL only
# clears what a reader that died never fetched.
SNAPSHOTS_TTL_S = 600.0


async def provision_snapshots(js: JetStreamContext, storage: str = "file", replicas: int = 1) -> ObjectStore:
    """Create the `snapshots` object store if missing (by the recorder, its only writer)."""
    return await until_ready(lambda: ensure_object_store(js, subjects.SNAPSHOTS_BUCKET, _storage(storage), replicas,
                                                         ttl=SNAPSHOTS_TTL_S),
                             f"object store {subjects.SNAPSHOTS_BUCKET}", PROVISION_ATTEMPTS)


# A replicated stream that was just created has no Raft leader for a moment: API calls then
# time out or get "no response from stream". Those are transient; anything else is not.
TRANSIENT = (nats.errors.TimeoutError, asyncio.TimeoutError, nats.errors.NoRespondersError,
             NoStreamResponseError, ServiceUnavailableError)
# A cluster whose servers have just started may not know its peers yet: placing a replicated
# stream then fails with "no suitable peers for placement" until the routes are up.
NO_PEERS_YET = 10005
# A cluster that has just started, on a loaded machine, may take half a minute to elect the
# leaders of new replicated streams: provisioning waits that long (12 attempts wait ~20 s).
PROVISION_ATTEMPTS = 20


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


async def _ensure_stream(js: JetStreamContext, cfg: StreamConfig) -> None:
    try:
        info = await js.stream_info(cfg.name)
    except NotFoundError:
        try:
            info = await js.add_stream(cfg)
        except BadRequestError as err:  # created concurrently by another service
            if "already in use" not in str(err):
                raise
            info = await js.stream_info(cfg.name)
    if (cfg.num_replicas or 1) > 1 and not (info.cluster and info.cluster.leader):
        raise nats.errors.TimeoutError  # no leader elected yet: until_ready asks again


# A message with `Nats-Rollup: all` on any subject of a stream that allows rollups purges the
# whole stream, and a NATS permission cannot look at headers: with rollups on, whoever may write
# one key of a bucket (an agent-host its own KV `hosts` entry, a checkpoint) may wipe it all.
# Populace never rolls up a KV bucket (a put replaces a key: history 1) nor the checkpoints
# (populace.core.checkpoints writes objects without it), so these streams refuse rollups.


def _kv_stream(bucket: str, ttl: float | None, storage: StorageType, replicas: int) -> StreamConfig:
    """What nats-py's create_key_value makes (history 1), without rollups."""
    return StreamConfig(name=f"KV_{bucket}", subjects=[f"$KV.{bucket}.>"], allow_rollup_hdrs=False,
                        allow_msg_ttl=True, deny_delete=True, discard=DiscardPolicy.NEW,
                        duplicate_window=min(ttl, 120.0) if ttl else 120.0, max_age=ttl, max_consumers=-1,
                        max_msgs=-1, max_msgs_per_subject=1, num_replicas=replicas, storage=storage)


def _object_stream(bucket: str, ttl: float | None, storage: StorageType, replicas: int) -> StreamConfig:
    """What nats-py's create_object_store makes, without rollups."""
    return StreamConfig(name=f"OBJ_{bucket}", subjects=[f"$O.{bucket}.C.>", f"$O.{bucket}.M.>"],
                        allow_rollup_hdrs=False, allow_direct=True, discard=DiscardPolicy.NEW, max_age=ttl,
                        max_bytes=-1, num_replicas=replicas, storage=storage)


def _warn_rollups(info, stream: str) -> None:
    """A stream made before Populace refused rollups (or by another tool) still allows them:
    say so, with the fix (services may not update streams)."""
    if info.config.allow_rollup_hdrs:
        log.warning("stream_allows_rollups", stream=stream,
                    fix=f"nats stream edit {stream} --no-allow-rollup (as an admin user)",
                    risk="any user that may write one of its subjects may purge it whole")


async def ensure_kv(js: JetStreamContext, bucket: str, ttl: float | None = None,
                    storage: StorageType = StorageType.FILE, replicas: int = 1) -> KeyValue:
    try:
        kv = await js.key_value(bucket)
    except BucketNotFoundError:
        try:
            await js.add_stream(_kv_stream(bucket, ttl, storage, replicas))
            kv = await js.key_value(bucket)
        except BadRequestError:  # created concurrently by another service
            try:
                kv = await js.key_value(bucket)
            except BucketNotFoundError:  # just created elsewhere, not visible here yet
                raise nats.errors.TimeoutError from None
        except BucketNotFoundError:  # just created, not visible here yet
            raise nats.errors.TimeoutError from None
    else:
        _warn_rollups(await js.stream_info(f"KV_{bucket}"), f"KV_{bucket}")
    await _has_leader(js, f"KV_{bucket}", replicas)
    return kv


async def ensure_object_store(js: JetStreamContext, bucket: str, storage: StorageType = StorageType.FILE,
                              replicas: int = 1, ttl: float | None = None, rollups: bool = True) -> ObjectStore:
    """`rollups=False`: a bucket written only with populace.core.checkpoints (nats-py's put()
    rolls its metadata up), whose writers must not be able to purge it."""
    try:
        store = await js.object_store(bucket)
    except BucketNotFoundError:
        try:
            if rollups:
                store = await js.create_object_store(
                    bucket, config=ObjectStoreConfig(storage=storage, replicas=replicas, ttl=ttl))
            else:
                await js.add_stream(_object_stream(bucket, ttl, storage, replicas))
                store = await js.object_store(bucket)
        except (BadRequestError, BucketNotFoundError):  # created concurrently by another service
            raise nats.errors.TimeoutError from None  # until_ready looks again
    else:
        if not rollups:
            _warn_rollups(await js.stream_info(f"OBJ_{bucket}"), f"OBJ_{bucket}")
    await _has_leader(js, f"OBJ_{bucket}", replicas)
    return store


async def _has_leader(js: JetStreamContext, stream: str, replicas: int) -> None:
    """A replicated bucket's stream is usable once it has a Raft leader; until then raise a
    transient error, so until_ready asks again."""
    if replicas <= 1:
        return
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        raise nats.errors.TimeoutError from None  # not visible here yet
    if not (info.cluster and info.cluster.leader):
        raise nats.errors.TimeoutError  # no leader elected yet


# A dead letter keeps this much of the refused message (enough to see what it was); its
# headers say the rest: where it came, how big it was, who sent it, why it was refused.
DLQ_EXCERPT_BYTES = 1024


def dlq_headers(msg, reason: str, instance: str = "") -> dict[str, str]:
    """A dead letter's headers, the refused message's reference: its subject, the stream and
    sequence it is stored under (JetStream; a reader fetches it there while it is kept), its
    size, its sender as its subject names it (subjects.sender_of), why it was refused, and which
    process refused it (several instances of a service may each get a core NATS message)."""
    data = msg.data or b""
    headers = {"Populace-Subject": msg.subject, "Populace-Error": reason[:1000], "Populace-Instance": instance,
               "Populace-Size": str(len(data)), "Populace-Sender": subjects.sender_of(msg.subject)}
    if is_jetstream(msg):
        try:
            meta = msg.metadata
            headers["Populace-Stream"], headers["Populace-Sequence"] = meta.stream, str(meta.sequence.stream)
        except Exception:  # an ack subject it cannot parse: the reference has no sequence
            pass
    if len(data) > DLQ_EXCERPT_BYTES:
        headers["Populace-Truncated"] = "1"
    return headers


def is_jetstream(raw_msg) -> bool:
    return raw_msg is not None and bool(raw_msg.reply) and raw_msg.reply.startswith("$JS.ACK")


def short_error(error: Exception | str) -> str:
    if isinstance(error, ValidationError):
        parts = [f"{'.'.join(str(p) for p in e['loc']) or '(body)'}: {e['msg']}" for e in error.errors()[:5]]
        return "; ".join(parts)
    return str(error)


async def publish_js(js: JetStreamContext, subject: str, model: BaseModel, msg_id: str | None = None,
                     timeout: float = 5.0, attempts: int = 12) -> None:
    """One JetStream publish awaiting its PubAck (control plane). De-duplicated by msg_id, so
    it is retried through transient errors — e.g. the stream's leader being re-elected after a
    node died (~5–10 s), during which a lost publish would otherwise stall a run."""
    headers = telemetry.inject({"Nats-Msg-Id": seal(js, msg_id)} if msg_id else None)
    data = encode(model)

    async def once() -> None:
        await js.publish(subject, data, headers=headers, timeout=timeout)

    await until_ready(once, f"publish {subject}", attempts=attempts if msg_id else 1)


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
            try:
                await self._beat()
            except Exception as err:
                log.warning("heartbeat_failed", key=self._key, error=str(err))

    async def stop(self, delete: bool = True) -> None:
        if self._task:
            self._task.cancel()
        if delete:
            try:
                await self._kv.delete(self._key)
            except Exception:
                pass


async def registry_entries(js: JetStreamContext, bucket: str, model: type[M],
                           fresh_within_s: float | None = None, strict: bool = False) -> list[M]:
    """Current entries of a registry bucket, skipping stale or malformed ones (entries without
    a `heartbeat_at`, such as run states, are never stale).

    `strict`: a failed read (e.g. during a leader election) raises instead of looking like an
    empty registry. A caller that acts on *absence* (declaring a host lost) must use it."""
    kv = await js.key_value(bucket)
    try:
        keys = await kv.keys()
    except NoKeysError:
        return []
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


# How long a receiver waits for KV `runs` to catch up with an announcement it got first (a KV
# read from a replica behind its leader), before it refuses the announcement.
STATE_LAG_S = 2.0


async def run_state(js: JetStreamContext, run_id: str) -> RunState | None:
    """The run's state in KV `runs` (None: not a run of this stack)."""
    kv = await js.key_value(subjects.RUNS_BUCKET)
    try:
        return runconfigs.CACHE.state((await kv.get(run_id)).value)  # its config validated once per process
    except KeyNotFoundError:
        return None


async def run_head(js: JetStreamContext, run_id: str) -> RunHead | None:
    """The run's state in KV `runs` without its config (None: not a run of this stack)."""
    kv = await js.key_value(subjects.RUNS_BUCKET)
    try:
        return RunHead.model_validate_json((await kv.get(run_id)).value)
    except KeyNotFoundError:
        return None


async def open_refusal(js: JetStreamContext, opened: RoundOpen) -> str | None:
    """Why a round open is not the run's (`admission.open_refusal`), read against the run's
    state in KV `runs`; None: it is."""
    # A poll for KV to catch up, not a retry of a failing call: plainer than tenacity's retry_if_result.
    deadline = time.monotonic() + STATE_LAG_S
    while True:
        state = await run_head(js, opened.run_id)  # every round: the config is not validated again
        why = admission.open_refusal(state, opened)
        if why is None or not admission.may_lag(state, opened) or time.monotonic() > deadline:
            return why
        await asyncio.sleep(0.1)
