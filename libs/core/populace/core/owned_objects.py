"""Objects bound to their writer, in the object store `checkpoints`: a layout of its stream of our
own (nats-py's object store takes the newest metadata of a name, whoever published it).

- Every chunk one writer stores for one run goes on one subject, `$O.checkpoints.C.<writer>.<rid>`
  (`subjects.checkpoint_chunks`). The stream bounds the messages of each subject (provisioning:
  POPULACE_CHECKPOINTS_WRITER_RUN_MAX_BYTES), so the server itself bounds what one writer stores
  for one run, whatever the writer's code does.
- Each object's metadata (`StoredObject`: its size, sha256, and where its chunks are) goes on
  `$O.checkpoints.M.<writer>.<rid>.<base64url name>`. A writer's NATS user may publish under its
  own token only (deploy/nats/auth.conf), and a reader looks for an object under the writer it
  expects only (the share's host, the environment, the orchestrator): a forged newest version of
  the name under another user's token is never looked at, so the genuine object is always found.
- A read has a deadline and an upper bound on size: metadata whose chunks hold nothing, or
  more than it says, fails at once with a named error (CheckpointUnavailable: transient, a
  resume reads again), never a wait without end.

A writer's objects for one run are written one at a time (per process), so an object's chunks
are consecutive on its subject and a read fetches them in a few batched direct gets."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import NamedTuple

from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError
from pydantic import ValidationError
from pydantic_core import to_json

from populace.core import subjects
from populace.core.bus import CHUNK_BYTES, until_ready

# the largest message is the stream's limit (the bus provisions it); the name stays importable from here
from populace.core.bus import MAX_MESSAGE_BYTES as MAX_MESSAGE_BYTES
from populace.core.checkpoint_rows import CheckpointError
from populace.core.contracts import StoredObject

# A read's bound when its caller gives none: no checkpoint object a run writes comes near it
# (a 10M-agent run's full checkpoint is ~30 MB per host); what a writer may store per run is
# bounded by the stream anyway.
MAX_OBJECT_BYTES = 4 * 2**30
# Chunks fetched per direct-get batch (8 MiB): the answer fits a subscription's pending limit.
WINDOW_CHUNKS = 64
# A read's deadline: this long, plus the object's size at the slowest rate a healthy server
# answers at; and the longest wait for the next message of a batch.
READ_BASE_S = 20.0
READ_MIN_BYTES_PER_S = 4 * 2**20
IDLE_S = 5.0
# What a refused write's JetStream error says (err_code 10077: "maximum bytes exceeded",
# "maximum messages per subject exceeded"; 10023/10047: the server's storage is exhausted).
FULL_CODES = (10077, 10023, 10047)


class CheckpointMissing(CheckpointError):
    """No object of that name under its expected writer (never written, or pruned)."""


class CheckpointUnavailable(CheckpointError):
    """An object's chunks are not all there, or did not come within its deadline: transient
    (a resume reads it again), never a wait without end."""


class StoreFull(CheckpointError):
    """A write the object store refused: the bucket's byte limit, what one writer may store for
    one run, or the server's storage. The run pauses naming it; starting runs is never blocked
    (every stream's room is reserved: bus.provision)."""


def encode_name(name: str) -> str:
    """An object's name as one subject token (names have dots), as nats-py encodes it."""
    return base64.urlsafe_b64encode(name.encode()).decode()


def decode_name(token: str) -> str | None:
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def meta_subject(writer: str, name: str) -> str:
    return subjects.checkpoint_meta(writer, subjects.checkpoint_run_of(name), encode_name(name))


def _checked(writer: str, name: str) -> str:
    rid = subjects.checkpoint_run_of(name)
    if not subjects.valid_token(writer) or not subjects.valid_token(rid):
        raise ValueError(f"checkpoint {name!r} by {writer!r}: the writer and the run id must be subject tokens")
    return rid


# (writer, run) -> [lock, users]: one write at a time per chunk subject in this process
_writing: dict[tuple[str, str], list] = {}


@asynccontextmanager
async def _one_at_a_time(writer: str, rid: str) -> AsyncIterator[None]:
    entry = _writing.setdefault((writer, rid), [asyncio.Lock(), 0])
    entry[1] += 1
    try:
        async with entry[0]:
            yield
    finally:
        entry[1] -= 1
        if entry[1] == 0:
            _writing.pop((writer, rid), None)


def full_reason(err: APIError, writer: str, rid: str) -> str:
    """What a refused write says, naming the store and the setting that bounds it."""
    what = (err.description or "").lower()
    if "per subject" in what:
        return (f"{writer} has stored all it may for run {rid} in the object store '{subjects.CHECKPOINTS_BUCKET}' "
                "(its bound per writer and run: POPULACE_CHECKPOINTS_WRITER_RUN_MAX_BYTES, set when the store "
                "is created)")
    if "bytes" in what:
        return (f"the object store '{subjects.CHECKPOINTS_BUCKET}' is full (POPULACE_CHECKPOINTS_MAX_BYTES); the "
                "recorder purges objects of no run every POPULACE_CHECKPOINTS_SWEEP_S")
    return f"the NATS server has no JetStream storage left for the object store '{subjects.CHECKPOINTS_BUCKET}'"


async def _publish(js: JetStreamContext, subject: str, data: bytes, writer: str, rid: str) -> int:
    try:
        return (await js.publish(subject, data)).seq
    except APIError as err:
        if err.err_code in FULL_CODES:
            raise StoreFull(full_reason(err, writer, rid)) from None
        raise


async def write_object(js: JetStreamContext, name: str, data: bytes, writer: str,
                       needs: Iterable[str] = ()) -> StoredObject:
    """Store `data` as object `name` of `writer` (its chunks, then its metadata); returns the
    metadata. A write cut short leaves chunks nobody names, purged with the run (or, for a run
    that is not there, by the recorder's sweep). StoreFull when the store refuses it."""
    rid = _checked(writer, name)
    chunk_subject = subjects.checkpoint_chunks(writer, rid)
    async with _one_at_a_time(writer, rid):
        first = last = count = 0
        for at in range(0, len(data), CHUNK_BYTES):
            last = await _publish(js, chunk_subject, data[at:at + CHUNK_BYTES], writer, rid)
            first = first or last
            count += 1
        meta = StoredObject(name=name, writer=writer, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                            chunks=count, first_seq=first, last_seq=last, needs=list(needs))
        await _publish(js, meta_subject(writer, name), to_json(meta), writer, rid)
    return meta


async def read_meta(js: JetStreamContext, name: str, writer: str) -> StoredObject:
    """The newest metadata `writer` published for `name` (CheckpointMissing: none)."""
    _checked(writer, name)

    async def newest():
        try:
            return await js.get_last_msg(subjects.CHECKPOINTS_STREAM, meta_subject(writer, name), direct=True)
        except NotFoundError:
            return None

    raw = await until_ready(newest, f"checkpoint {name}")
    if raw is None or not raw.data:
        raise CheckpointMissing(f"checkpoint {name} by {writer} is not in the object store "
                                f"'{subjects.CHECKPOINTS_BUCKET}'")
    try:
        meta = StoredObject.model_validate_json(raw.data)
    except ValidationError as err:
        raise CheckpointError(f"checkpoint {name}: its metadata by {writer} is malformed "
                              f"({err.error_count()} error(s), first: {err.errors()[0]['msg']})") from None
    if meta.name != name or meta.writer != writer:
        raise CheckpointError(f"checkpoint {name}: its metadata by {writer} describes {meta.name!r} by {meta.writer!r}")
    return meta


# Versions of one object by its writer looked at when its newest is not the one recorded: a writer
# writes a name again when a round is played again, and a placed writer may spoil its own newest.
MAX_VERSIONS = 32


async def read_object(js: JetStreamContext, name: str, writer: str, max_bytes: int | None = None,
                      sha256: str | None = None) -> bytes:
    """Object `name` as `writer` stored it: its bytes, at most `max_bytes` (CheckpointError when
    it says it has more), within its deadline (CheckpointUnavailable when its chunks are not all
    there, more than it says, or too slow). With `sha256` (the digest its record names), the
    newest of the writer's versions of it that has that digest and reads whole; if none does, the
    newest's bytes (the caller's digest check refuses them, naming the object)."""
    meta = await read_meta(js, name, writer)
    if sha256 is None:
        return await _bounded(js, meta, max_bytes)
    failed: CheckpointError | None = None
    if meta.sha256 == sha256:
        data, failed = await _verified(js, meta, max_bytes, sha256)
        if data is not None:
            return data
    for version in await _versions(js, name, writer):  # the newest is not the one recorded: the ones before it
        if version != meta and version.sha256 == sha256:
            data, err = await _verified(js, version, max_bytes, sha256)
            if data is not None:
                return data
            failed = failed or err
    if failed is not None:
        raise failed
    return await _bounded(js, meta, max_bytes)


async def _verified(js: JetStreamContext, meta: StoredObject, max_bytes: int | None,
                    sha256: str) -> tuple[bytes | None, CheckpointError | None]:
    """A version's bytes if they have `sha256`; else None, and why it could not be read (None: it
    was, and its bytes are others)."""
    try:
        data = await _bounded(js, meta, max_bytes)
    except CheckpointUnavailable as err:
        return None, err
    return (data if hashlib.sha256(data).hexdigest() == sha256 else None), None


async def _bounded(js: JetStreamContext, meta: StoredObject, max_bytes: int | None) -> bytes:
    bound = MAX_OBJECT_BYTES if max_bytes is None else max_bytes
    if meta.size > bound:
        raise CheckpointError(f"checkpoint {meta.name} by {meta.writer} holds {meta.size:,} bytes, more than the "
                              f"{bound:,} its reader takes")
    return await read_chunks(js, meta)


async def _versions(js: JetStreamContext, name: str, writer: str) -> list[StoredObject]:
    """The writer's versions of `name` still in the store, the newest first (at most MAX_VERSIONS:
    the newest ones; malformed ones left out)."""
    subject = meta_subject(writer, name)
    deadline = asyncio.get_running_loop().time() + READ_BASE_S
    found: list[StoredObject] = []
    seq = 1
    while True:
        batch = await _batch(js, subject, seq, WINDOW_CHUNKS, deadline, f"checkpoint {name} by {writer}")
        for _, data in batch:
            try:
                meta = StoredObject.model_validate_json(data)
            except ValidationError:
                continue
            if meta.name == name and meta.writer == writer:
                found.append(meta)
        if len(batch) < WINDOW_CHUNKS:
            return found[::-1][:MAX_VERSIONS]
        seq = batch[-1][0] + 1
        found = found[-MAX_VERSIONS:]


async def read_chunks(js: JetStreamContext, meta: StoredObject) -> bytes:
    if meta.size == 0:
        return b""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READ_BASE_S + meta.size / READ_MIN_BYTES_PER_S
    subject = subjects.checkpoint_chunks(meta.writer, subjects.checkpoint_run_of(meta.name))
    what = f"checkpoint {meta.name} by {meta.writer}"
    buf = bytearray()
    got, seq = 0, meta.first_seq
    while got < meta.chunks:
        want = min(WINDOW_CHUNKS, meta.chunks - got)
        batch = await _batch(js, subject, seq, want, deadline, what)
        for msg_seq, data in batch:
            if msg_seq > meta.last_seq or len(buf) + len(data) > meta.size:
                raise CheckpointUnavailable(f"{what}: its chunks are not all there (its subject holds others where "
                                            f"its {meta.chunks} chunks should be)")
            buf += data
            seq = msg_seq + 1
        got += len(batch)
        if len(batch) < want:
            raise CheckpointUnavailable(f"{what}: {got} of its {meta.chunks} chunks are there "
                                        f"({len(buf):,} of {meta.size:,} bytes)")
    if len(buf) != meta.size:
        raise CheckpointUnavailable(f"{what}: its chunks hold {len(buf):,} bytes, not {meta.size:,}")
    return bytes(buf)


async def _batch(js: JetStreamContext, subject: str, seq: int, want: int, deadline: float,
                 what: str) -> list[tuple[int, bytes]]:
    """Up to `want` messages of `subject` from stream sequence `seq` on, in one direct get
    (nats-server ≥ 2.11: answered message by message, then an end-of-batch status)."""
    nc = js._nc  # the connection a JetStreamContext is made on (nats-py keeps no public name for it)
    loop = asyncio.get_running_loop()
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    try:
        await nc.publish(f"$JS.API.DIRECT.GET.{subjects.CHECKPOINTS_STREAM}",
                         json.dumps({"seq": seq, "batch": want, "next_by_subj": subject}).encode(), reply=inbox)
        out: list[tuple[int, bytes]] = []
        while len(out) < want:
            left = deadline - loop.time()
            if left <= 0:
                raise CheckpointUnavailable(f"{what}: its chunks did not come within its deadline")
            try:
                msg = await sub.next_msg(timeout=min(IDLE_S, left))
            except TimeoutError:
                raise CheckpointUnavailable(f"{what}: the server sent none of its chunks for {IDLE_S:g} s") from None
            headers = msg.headers or {}
            status = headers.get("Status")
            if status is not None:
                if status in ("404", "204"):  # nothing (more) on the subject: the batch ends here
                    return out
                raise CheckpointUnavailable(f"{what}: the server refused to read it ({status} "
                                            f"{headers.get('Description', '')})")
            if headers.get("Nats-Subject") != subject:
                raise CheckpointUnavailable(f"{what}: the server answered with a message of another subject")
            out.append((int(headers.get("Nats-Sequence", 0)), msg.data))
        return out
    finally:
        await sub.unsubscribe()


# --- what a run's objects are, and what belongs to no run -----------------------------------------
class Located(NamedTuple):
    """Where a subject of the store belongs: its writer (None: unknown, an object written before
    objects were bound to writers) and its run (None: none can be told)."""

    subject: str
    writer: str | None
    rid: str | None
    name: str | None = None
    legacy: bool = False  # a subject of the layout before this one (nats-py's metadata)


def locate(subject: str) -> Located:
    """Where a subject of stream OBJ_checkpoints belongs: a chunk or metadata subject of this
    layout, or of the one before it (nats-py's metadata `$O.checkpoints.M.<name>`, chunks
    `$O.checkpoints.C.<writer>.<name>.<nuid>`)."""
    tokens = subject.split(".")
    if tokens[:2] != ["$O", subjects.CHECKPOINTS_BUCKET] or len(tokens) < 4:
        return Located(subject, None, None)
    kind, rest = tokens[2], tokens[3:]
    if kind == "C" and len(rest) == 2:
        return Located(subject, rest[0], rest[1])
    if kind == "M" and len(rest) == 3:
        name = decode_name(rest[2])
        return Located(subject, rest[0], rest[1], name)
    if (kind == "C" and len(rest) == 3) or (kind == "M" and len(rest) == 1):  # the layout before
        name = decode_name(rest[1] if kind == "C" else rest[0])
        return Located(subject, rest[0] if kind == "C" else None,
                       subjects.checkpoint_run_of(name) if name else None, name, legacy=True)
    return Located(subject, None, None)


def strays(located: Iterable[Located], writers_of: Mapping[str, set[str] | None]) -> list[str]:
    """The subjects that belong to no run: of a run not in `writers_of` (KV `runs` does not know
    it), or written by a user that is not one of its writers (`writers_of[rid]`; None: any)."""
    out = []
    for at in located:
        if at.rid is None or at.rid not in writers_of:
            out.append(at.subject)
            continue
        allowed = writers_of[at.rid]
        if allowed is not None and at.writer is not None and at.writer not in allowed:
            out.append(at.subject)
    return sorted(out)
