"""Creating the streams, KV buckets and object stores a stack needs, if missing (safe from every
service at once), with the retention limits a service may set only when it creates them."""

from __future__ import annotations

import dataclasses

import nats
import nats.errors
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, BadRequestError, NotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from populace.core import logs, subjects
from populace.core.bus.retries import until_ready

log = logs.get("populace.bus")  # every part of the bus logs under one name


# A cluster that has just started, on a loaded machine, may take half a minute to elect the
# leaders of new replicated streams: provisioning waits that long (12 attempts wait ~20 s).
PROVISION_ATTEMPTS = 20


class StreamLimitError(RuntimeError):
    """A stream's retention limits are more than the NATS server can give it."""


def _storage(kind: str) -> StorageType:
    return StorageType.MEMORY if kind == "memory" else StorageType.FILE


# Every stream and bucket has a byte limit (together about 35 GiB on file storage, 5.6 GiB in
# memory: nats-server's default storage is 75% of the free disk or RAM), set when a service creates
# it (services may not update streams: an existing stream keeps its limits; `nats stream edit` as
# `admin` changes them). nats-server reserves a stream's limit when it creates the stream, so no
# stream can take another's room: a full object store never keeps `ctl.run.start` out (with the
# checkpoints unbounded, one host's 1.5 GB filled the server's storage and every publish, CTL's
# too, failed "insufficient resources": issue 41). RUN refuses new events once full (DiscardPolicy.NEW: a publish fails
# loudly, never an unrecorded event dropped in silence); CTL and DLQ drop their oldest (each
# control request was handled long before, each dead letter logged when it was refused).
RUN_MAX_AGE_S = 30 * 86400.0
RUN_MAX_BYTES = {"file": 16 * 2**30, "memory": 2 * 2**30}  # a memory stream's bytes are reserved in RAM
DLQ_MAX_AGE_S = 7 * 86400.0
DLQ_MAX_BYTES = 256 * 2**20
CTL_MAX_BYTES = {"file": 256 * 2**20, "memory": 32 * 2**20}
# KV `runs`: one entry per run ever started (a few KB to a few hundred; only the orchestrator writes
# it); the registries (hosts, services, replicas, nodes, pacing) hold live entries only (TTL'd).
RUNS_MAX_BYTES = {"file": 256 * 2**20, "memory": 32 * 2**20}
REGISTRY_MAX_BYTES = {"file": 16 * 2**20, "memory": 4 * 2**20}
# The checkpoints of the runs kept (POPULACE_CHECKPOINTS_MAX_BYTES): a run's are about agents ×
# declared state bytes × (1 + POPULACE_CHECKPOINT_DELTA_RATIO) per POPULACE_CHECKPOINT_FULL_EVERY
# rounds, plus its worlds (docs/limits.md). What one writer may store for one run
# (POPULACE_CHECKPOINTS_WRITER_RUN_MAX_BYTES) is bounded in messages of up to 128 KiB, and a small
# object takes a message too: by default a quarter of the store, and never fewer messages than a
# 10,000-round run's writer writes (its objects each round, one to three, some of several chunks).
CHECKPOINTS_MAX_BYTES = {"file": 8 * 2**30, "memory": 1 * 2**30}
# Each chunk of a `checkpoints` object (populace.core.owned_objects), what nats-py's object store
# uses: well under NATS's 1 MB payload. The largest message the stream takes (a chunk, or an
# object's metadata): an attacker's message costs no more than a chunk of what its writer may store.
CHUNK_BYTES = 128 * 1024
MAX_MESSAGE_BYTES = CHUNK_BYTES + 4096
WRITER_RUN_SHARE = 4
MIN_WRITER_RUN_MESSAGES = 32_768
# Content-addressed personas files and graphs (POPULACE_BLOBS_MAX_BYTES, each store): a 1M-agent
# personas file is ~400 MB; the recorder's snapshots live 10 minutes.
BLOBS_MAX_BYTES = {"file": 4 * 2**30, "memory": 1 * 2**30}
SNAPSHOTS_MAX_BYTES = {"file": 2 * 2**30, "memory": 256 * 2**20}
# nats-server refuses a stream whose byte limit it cannot reserve (its default JetStream storage
# is 75% of the free disk or RAM): a default limit is then halved until it fits, down to this.
INSUFFICIENT_RESOURCES = (10028, 10047)  # memory, storage
MIN_DEFAULT_BYTES = 16 * 2**20


def stream_limits(settings) -> dict:
    """provision()'s retention arguments from the settings (POPULACE_RUN_MAX_AGE_S …)."""
    return {"run_max_age_s": settings.run_max_age_s, "run_max_bytes": settings.run_max_bytes,
            "dlq_max_age_s": settings.dlq_max_age_s, "dlq_max_bytes": settings.dlq_max_bytes,
            "checkpoints_max_bytes": settings.checkpoints_max_bytes,
            "checkpoints_writer_run_max_bytes": settings.checkpoints_writer_run_max_bytes,
            "blobs_max_bytes": settings.blobs_max_bytes}


def _kind(st: StorageType) -> str:
    return "memory" if st == StorageType.MEMORY else "file"


async def _reserve(js: JetStreamContext, cfg: StreamConfig, setting: str | None, by_default: bool,
                   create, resize=None) -> StreamConfig:
    """Create `cfg`'s stream (by `create(cfg)`, if missing), its byte limit halved while the
    server cannot reserve a default one (`resize(cfg, max_bytes)`: what else follows from it); a
    limit the operator set is kept (StreamLimitError)."""
    while True:
        try:
            await until_ready(lambda cfg=cfg: create(cfg), f"stream {cfg.name}", PROVISION_ATTEMPTS)
            return cfg
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
            cfg = resize(cfg, cfg.max_bytes // 2) if resize else dataclasses.replace(cfg, max_bytes=cfg.max_bytes // 2)


async def provision(js: JetStreamContext, storage: str = "file", replicas: int = 1,
                    run_max_age_s: float = RUN_MAX_AGE_S, run_max_bytes: int | None = None,
                    dlq_max_age_s: float = DLQ_MAX_AGE_S, dlq_max_bytes: int | None = None,
                    checkpoints_max_bytes: int | None = None, checkpoints_writer_run_max_bytes: int | None = None,
                    blobs_max_bytes: int | None = None) -> None:
    """Create the CTL/RUN/DLQ streams, the KV buckets and the object stores if missing, each with
    its byte limit (None: the default for the storage, lowered if the server cannot reserve it).
    Safe to call from every service at start-up, concurrently. RUN and DLQ are bounded by age
    too (`run_max_age_s` 0: no age limit); the limits are set only when a stream is created
    here (services may not update streams)."""
    st = _storage(storage)
    kind = _kind(st)
    streams = [  # the small ones reserved first: CTL's room before anything else's, RUN fits itself in the rest
        (StreamConfig(name=subjects.CTL_STREAM, subjects=subjects.CTL_SUBJECTS, storage=st,
                      num_replicas=replicas, duplicate_window=120.0, max_bytes=CTL_MAX_BYTES[kind],
                      discard=DiscardPolicy.OLD), "CTL_MAX_BYTES (nats stream edit CTL)", True),
        (StreamConfig(name=subjects.DLQ_STREAM, subjects=subjects.DLQ_SUBJECTS, storage=st,
                      num_replicas=replicas, max_msgs=100_000, max_age=dlq_max_age_s,
                      max_bytes=dlq_max_bytes or DLQ_MAX_BYTES, discard=DiscardPolicy.OLD),
         "POPULACE_DLQ_MAX_BYTES", dlq_max_bytes is None),
    ]
    for cfg, setting, by_default in streams:
        await _reserve(js, cfg, setting, by_default, lambda c: _ensure_stream(js, c))
    for bucket, ttl, limit in (
        (subjects.RUNS_BUCKET, None, RUNS_MAX_BYTES[kind]),
        (subjects.HOSTS_BUCKET, 30.0, REGISTRY_MAX_BYTES[kind]),
        (subjects.SERVICES_BUCKET, 30.0, REGISTRY_MAX_BYTES[kind]),
        (subjects.REPLICAS_BUCKET, 30.0, REGISTRY_MAX_BYTES[kind]),
    ):
        await ensure_kv(js, bucket, ttl=ttl, storage=st, replicas=replicas, max_bytes=limit)
    run = StreamConfig(name=subjects.RUN_STREAM, subjects=subjects.RUN_SUBJECTS, storage=st,
                       num_replicas=replicas, duplicate_window=120.0,
                       max_msg_size=8 * 1024 * 1024, max_age=run_max_age_s or None,
                       max_bytes=run_max_bytes or RUN_MAX_BYTES[kind], discard=DiscardPolicy.NEW)
    await _reserve(js, run, "POPULACE_RUN_MAX_BYTES", run_max_bytes is None, lambda c: _ensure_stream(js, c))
    await ensure_checkpoints(js, st, replicas, checkpoints_max_bytes, checkpoints_writer_run_max_bytes)
    for bucket in (subjects.PERSONAS_BUCKET, subjects.GRAPHS_BUCKET):
        await ensure_object_store(js, bucket, storage=st, replicas=replicas,
                                  max_bytes=blobs_max_bytes or BLOBS_MAX_BYTES[kind],
                                  setting="POPULACE_BLOBS_MAX_BYTES", by_default=blobs_max_bytes is None)


# KV `nodes` is provisioned by the nodes alone (readers treat a missing bucket as no nodes):
# in provision() it would cost every service's NATS user two more JetStream API grants.
NODES_TTL_S = 30.0


async def provision_nodes(js: JetStreamContext, storage: str = "file", replicas: int = 1) -> KeyValue:
    """Create KV `nodes` if missing (TTL'd like the other registries) and return it."""
    st = _storage(storage)
    return await ensure_kv(js, subjects.NODES_BUCKET, ttl=NODES_TTL_S, storage=st, replicas=replicas,
                           max_bytes=REGISTRY_MAX_BYTES[_kind(st)])


# KV `pacing` is provisioned by the gateways alone (no other user may read or write it). An entry is
# rewritten at every lease while its model is called; one untouched this long is dropped, which
# loses nothing (its buckets would be full again by then) but a pause longer than it (Retry-After
# is read up to an hour: populace.gateway.openai_api.retry_after).
PACING_TTL_S = 3600.0


async def provision_pacing(js: JetStreamContext, storage: str = "file", replicas: int = 1) -> KeyValue:
    """Create KV `pacing` if missing (the gateways' shared limits) and return it."""
    st = _storage(storage)
    return await ensure_kv(js, subjects.PACING_BUCKET, ttl=PACING_TTL_S, storage=st, replicas=replicas,
                           max_bytes=REGISTRY_MAX_BYTES[_kind(st)])


# Snapshots (a DuckDB file per reader of a live run) are fetched at once; the TTL only
# clears what a reader that died never fetched.
SNAPSHOTS_TTL_S = 600.0


async def provision_snapshots(js: JetStreamContext, storage: str = "file", replicas: int = 1) -> ObjectStore:
    """Create the `snapshots` object store if missing (by the recorder, its only writer)."""
    st = _storage(storage)
    return await ensure_object_store(js, subjects.SNAPSHOTS_BUCKET, st, replicas, ttl=SNAPSHOTS_TTL_S,
                                     max_bytes=SNAPSHOTS_MAX_BYTES[_kind(st)], setting="SNAPSHOTS_MAX_BYTES")


async def _ensure_stream(js: JetStreamContext, cfg: StreamConfig, setting: str | None = None):
    """`cfg`'s stream, created if missing (by another service concurrently, too); an existing
    one is kept as it is (services may not update streams), with a warning if it is unbounded."""
    try:
        info = await js.stream_info(cfg.name)
    except NotFoundError:
        try:
            info = await js.add_stream(cfg)
        except BadRequestError as err:  # created concurrently by another service
            if "already in use" not in str(err):
                raise
            info = await js.stream_info(cfg.name)
    else:
        _warn_unbounded(info, cfg.name, setting)
    if (cfg.num_replicas or 1) > 1 and not (info.cluster and info.cluster.leader):
        raise nats.errors.TimeoutError  # no leader elected yet: until_ready asks again
    return info


# A message with `Nats-Rollup: all` on any subject of a stream that allows rollups purges the
# whole stream, and a NATS permission cannot look at headers: with rollups on, whoever may write
# one key of a bucket (an agent-host its own KV `hosts` entry, a checkpoint) may wipe it all.
# Populace never rolls up a KV bucket (a put replaces a key: history 1) nor the checkpoints
# (populace.core.checkpoints writes objects without it), so these streams refuse rollups.


def _kv_stream(bucket: str, ttl: float | None, storage: StorageType, replicas: int, max_bytes: int) -> StreamConfig:
    """What nats-py's create_key_value makes (history 1), without rollups, bounded by bytes."""
    return StreamConfig(name=f"KV_{bucket}", subjects=[f"$KV.{bucket}.>"], allow_rollup_hdrs=False,
                        allow_msg_ttl=True, deny_delete=True, discard=DiscardPolicy.NEW,
                        duplicate_window=min(ttl, 120.0) if ttl else 120.0, max_age=ttl, max_consumers=-1,
                        max_msgs=-1, max_msgs_per_subject=1, num_replicas=replicas, storage=storage,
                        max_bytes=max_bytes)


def _object_stream(bucket: str, ttl: float | None, storage: StorageType, replicas: int, max_bytes: int,
                   rollups: bool) -> StreamConfig:
    """What nats-py's create_object_store makes (with or without rollups), bounded by bytes."""
    return StreamConfig(name=f"OBJ_{bucket}", subjects=[f"$O.{bucket}.C.>", f"$O.{bucket}.M.>"],
                        allow_rollup_hdrs=rollups, allow_direct=True, discard=DiscardPolicy.NEW, max_age=ttl,
                        max_bytes=max_bytes, num_replicas=replicas, storage=storage)


def checkpoints_stream(storage: StorageType, replicas: int, max_bytes: int,
                       writer_run_max_bytes: int | None = None) -> StreamConfig:
    """The `checkpoints` store's stream (populace.core.owned_objects): no rollups; every message at
    most a chunk; each subject (all one writer stores for one run, or one object's versions) at
    most `writer_run_max_bytes` of chunks (default: WRITER_RUN_SHARE of the store, at least
    MIN_WRITER_RUN_MESSAGES messages), past which a publish is refused."""
    per_subject = (max(1, writer_run_max_bytes // CHUNK_BYTES) if writer_run_max_bytes is not None
                   else max(MIN_WRITER_RUN_MESSAGES, max_bytes // WRITER_RUN_SHARE // CHUNK_BYTES))
    return dataclasses.replace(_object_stream(subjects.CHECKPOINTS_BUCKET, None, storage, replicas, max_bytes, False),
                               max_msg_size=MAX_MESSAGE_BYTES, discard_new_per_subject=True,
                               max_msgs_per_subject=per_subject)


async def ensure_checkpoints(js: JetStreamContext, storage: StorageType, replicas: int, max_bytes: int | None,
                             writer_run_max_bytes: int | None) -> None:
    """Create the `checkpoints` store if missing (checkpoints_stream), with its limits."""
    cfg = checkpoints_stream(storage, replicas, max_bytes or CHECKPOINTS_MAX_BYTES[_kind(storage)],
                             writer_run_max_bytes)

    async def create(c: StreamConfig) -> None:
        await _ensure_stream(js, c, "POPULACE_CHECKPOINTS_MAX_BYTES")
        await _has_leader(js, c.name, replicas)

    await _reserve(js, cfg, "POPULACE_CHECKPOINTS_MAX_BYTES", max_bytes is None, create,
                   resize=lambda c, limit: checkpoints_stream(storage, replicas, limit, writer_run_max_bytes))


def _warn_rollups(info, stream: str) -> None:
    """A stream made before Populace refused rollups (or by another tool) still allows them:
    say so, with the fix (services may not update streams)."""
    if info.config.allow_rollup_hdrs:
        log.warning("stream_allows_rollups", stream=stream,
                    fix=f"nats stream edit {stream} --no-allow-rollup (as an admin user)",
                    risk="any user that may write one of its subjects may purge it whole")


def _warn_unbounded(info, stream: str, setting: str | None) -> None:
    """A stream made before every stream had a byte limit: say so, with the fix."""
    if (info.config.max_bytes or -1) < 0:
        log.warning("stream_unbounded", stream=stream, setting=setting,
                    fix=f"nats stream edit {stream} --max-bytes <bytes> (as an admin user)",
                    risk="it can fill the server's storage, and then every stream refuses publishes")


async def ensure_kv(js: JetStreamContext, bucket: str, ttl: float | None = None,
                    storage: StorageType = StorageType.FILE, replicas: int = 1,
                    max_bytes: int | None = None) -> KeyValue:
    """KV `bucket`, created if missing (history 1, no rollups, at most `max_bytes`: the
    registries' default)."""
    limit = max_bytes or REGISTRY_MAX_BYTES[_kind(storage)]
    cfg = _kv_stream(bucket, ttl, storage, replicas, limit)

    async def create(c: StreamConfig) -> None:
        info = await _ensure_stream(js, c, None)
        _warn_rollups(info, c.name)
        await _has_leader(js, c.name, replicas)

    await _reserve(js, cfg, f"the bucket {bucket}'s limit", True, create)
    return await until_ready(lambda: js.key_value(bucket), f"bucket {bucket}", PROVISION_ATTEMPTS)


async def ensure_object_store(js: JetStreamContext, bucket: str, storage: StorageType = StorageType.FILE,
                              replicas: int = 1, ttl: float | None = None, max_bytes: int | None = None,
                              setting: str | None = None, by_default: bool = True) -> ObjectStore:
    """Object store `bucket` (nats-py's layout, rollups allowed: its put() rolls metadata up),
    created if missing, at most `max_bytes` (halved while the server cannot reserve a default)."""
    limit = max_bytes or BLOBS_MAX_BYTES[_kind(storage)]
    cfg = _object_stream(bucket, ttl, storage, replicas, limit, rollups=True)

    async def create(c: StreamConfig) -> None:
        await _ensure_stream(js, c, setting)
        await _has_leader(js, c.name, replicas)

    await _reserve(js, cfg, setting or f"the object store {bucket}'s limit", by_default, create)
    return await until_ready(lambda: js.object_store(bucket), f"object store {bucket}", PROVISION_ATTEMPTS)


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
