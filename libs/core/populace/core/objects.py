"""Content-addressed blobs on the bus: a personas file is stored once in the `personas`
object store under its sha256 and read by every host and the recorder — agents hold a
reference, the file never travels inside run messages."""

from __future__ import annotations

import hashlib
import io

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError, ObjectNotFoundError
from nats.js.object_store import OBJ_CHUNKS_PRE_TEMPLATE, ObjectStore

from populace.core import subjects
from populace.core.bus import until_ready


class BlobError(RuntimeError):
    """A blob is missing from the object store or does not match its digest."""


class ObjectRefused(BlobError):
    """An object is not the size its reader was told, or holds more bytes than its metadata says."""


# A bounded read waits this long for each chunk: chunks that never come (metadata naming chunks
# that hold nothing) end the read instead of holding it for ever.
CHUNK_WAIT_S = 10.0


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def read_object(store: ObjectStore, key: str) -> bytes:
    """An object's bytes. Not `store.get(key).data`: nats-py builds that with `data += chunk`,
    which copies everything read so far for every 128 KB chunk — quadratic: a 400 MB personas
    file (1M agents) took minutes per reader. Written into a buffer, it is linear."""
    buf = io.BytesIO()
    await store.get(key, writeinto=buf)
    return buf.getvalue()


async def read_sized(js: JetStreamContext, bucket: str, key: str, size: int,
                     chunk_wait_s: float = CHUNK_WAIT_S) -> bytearray:
    """An object's bytes, only if it holds exactly `size` (what its writer said elsewhere): its
    metadata must say `size`, and the read stops as soon as its chunks hold more (ObjectRefused)
    — nats-py's get() reads every chunk on the metadata's subject, however many. Its digest is
    the caller's to check. NotFoundError when there is no such object. A bytearray, filled in
    place: the bytes are held once."""
    store = await js.object_store(bucket)
    info = await store.get_info(key)
    if info.size != size:
        raise ObjectRefused(f"object {key} of '{bucket}' has {info.size:,} bytes by its metadata, not the {size:,} "
                            "its writer said")
    if size == 0:
        return bytearray()
    buf = bytearray(size)
    got = 0
    sub = await js.subscribe(OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=bucket, obj=info.nuid), ordered_consumer=True)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=chunk_wait_s)
            except (TimeoutError, NatsTimeoutError):
                raise ObjectRefused(f"object {key} of '{bucket}': no chunk came for {chunk_wait_s:g}s after "
                                    f"{got:,} of its {size:,} bytes") from None
            end = got + len(msg.data)
            if end > size:
                raise ObjectRefused(f"object {key} of '{bucket}' holds more than the {size:,} bytes its metadata says")
            buf[got:end] = msg.data
            got = end
            if msg.metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    if got != size:
        raise ObjectRefused(f"object {key} of '{bucket}' holds {got:,} bytes, not the {size:,} its metadata says")
    return buf


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
