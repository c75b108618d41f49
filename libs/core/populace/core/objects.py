"""Content-addressed blobs on the bus: a personas file is stored once in the `personas`
object store under its sha256 and read by every host and the recorder — agents hold a
reference, the file never travels inside run messages."""

from __future__ import annotations

import asyncio
import hashlib
import io

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from populace.core import subjects
from populace.core.bus import until_ready
from populace.core.owned_objects import READ_BASE_S, READ_MIN_BYTES_PER_S


class BlobError(RuntimeError):
    """A blob is missing from the object store or does not match its digest."""


# A bounded read waits this long for each chunk: chunks that never come (metadata naming chunks
# that hold nothing) end the read instead of holding it for ever.
CHUNK_WAIT_S = 10.0


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def read_object(store: ObjectStore, key: str) -> bytes:
    """An object's bytes, within a deadline from its size (nats-py's get() waits for its chunks
    without end: metadata whose chunks hold nothing would hang its reader). Not
    `store.get(key).data`: nats-py builds that with `data += chunk`, which copies everything read
    so far for every 128 KB chunk — quadratic: a 400 MB personas file (1M agents) took minutes per
    reader. Written into a buffer, it is linear."""
    info = await store.get_info(key)
    deadline = READ_BASE_S + (info.size or 0) / READ_MIN_BYTES_PER_S
    buf = io.BytesIO()
    try:
        async with asyncio.timeout(deadline) as scope:
            await store.get(key, writeinto=buf)
    except TimeoutError:
        if not scope.expired():
            raise  # the client's own request timeout: transient, asked again
        raise BlobError(f"{key[:12]}…: its {info.size:,} bytes did not come within {deadline:.0f} s") from None
    data = buf.getvalue()
    if len(data) != (info.size or 0):
        raise BlobError(f"{key[:12]}…: {len(data):,} bytes read, its metadata says {info.size:,}")
    return data


async def put_once(store: ObjectStore, key: str, data: bytes, what: str) -> None:
    """Put `data` under `key` (a digest of it) unless an object of that size is already there:
    content-addressed blobs are uploaded once, whoever asks again."""
    async def there() -> bool:
        try:
            info = await store.get_info(key)
        except (NotFoundError, ObjectNotFoundError):
            return False
        return info.size == len(data) and not info.deleted

    if not await until_ready(there, f"look up {what} {key[:12]}"):
        await until_ready(lambda: store.put(key, data), f"upload {what} {key[:12]}")


async def put_personas(js: JetStreamContext, data: bytes) -> str:
    """Store a personas JSONL (once: an identical file is already there) and return its digest."""
    digest = digest_of(data)
    await put_once(await js.object_store(subjects.PERSONAS_BUCKET), digest, data, "personas")
    return digest


async def get_personas(js: JetStreamContext, digest: str) -> bytes:
    store = await js.object_store(subjects.PERSONAS_BUCKET)
    try:
        data = await until_ready(lambda: read_object(store, digest), f"personas {digest[:12]}")
    except (NotFoundError, ObjectNotFoundError):
        raise BlobError(f"personas {digest} are not in the object store "
                        f"'{subjects.PERSONAS_BUCKET}' (uploaded to another NATS?)") from None
    if digest_of(data) != digest:
        raise BlobError(f"personas {digest}: stored bytes do not match their digest")
    return data
