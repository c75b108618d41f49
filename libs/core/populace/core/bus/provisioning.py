"""Creating the streams, KV buckets and object stores a stack needs, if missing (safe from every
service at once), with the retention limits a service may set only when it creates them."""

from __future__ import annotations

import dataclasses

import nats
import nats.errors
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, ObjectStoreConfig, StorageType, StreamConfig
from nats.js.errors import APIError, BadRequestError, BucketNotFoundError, NotFoundError
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


# KV `pacing` is provisioned by the gateways alone (no other user may read or write it). An entry is
# rewritten at every lease while its model is called; one untouched this long is dropped, which
# loses nothing (its buckets would be full again by then) but a pause longer than it (Retry-After
# is read up to an hour: populace.gateway.openai_api.retry_after).
PACING_TTL_S = 3600.0


async def provision_pacing(js: JetStreamContext, storage: str = "file", replicas: int = 1) -> KeyValue:
    """Create KV `pacing` if missing (the gateways' shared limits) and return it."""
    return await until_ready(lambda: ensure_kv(js, subjects.PACING_BUCKET, ttl=PACING_TTL_S,
                                               storage=_storage(storage), replicas=replicas),
                             f"bucket {subjects.PACING_BUCKET}", PROVISION_ATTEMPTS)


# Snapshots (a DuckDB file per reader of a live run) are fetched at once; the TTL only
# clears what a reader that died never fetched.
SNAPSHOTS_TTL_S = 600.0


async def provision_snapshots(js: JetStreamContext, storage: str = "file", replicas: int = 1) -> ObjectStore:
    """Create the `snapshots` object store if missing (by the recorder, its only writer)."""
    return await until_ready(lambda: ensure_object_store(js, subjects.SNAPSHOTS_BUCKET, _storage(storage), replicas,
                                                         ttl=SNAPSHOTS_TTL_S),
                             f"object store {subjects.SNAPSHOTS_BUCKET}", PROVISION_ATTEMPTS)


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
