"""Personas files in the bus's object store: stored once by digest, read back verified."""

from __future__ import annotations

import pytest

from populace.core import bus, objects

pytestmark = pytest.mark.integration


async def test_put_is_idempotent_and_get_verifies(js):
    await bus.provision(js, storage="memory")
    data = b'{"profile": {"education": "Ph.D."}}\n' * 50_000  # ~1.8 MB: several chunks
    digest = await objects.put_personas(js, data)
    assert digest == objects.digest_of(data)
    assert await objects.put_personas(js, data) == digest
    assert await objects.get_personas(js, digest) == data


async def test_missing_blob_is_a_clear_error(js):
    await bus.provision(js, storage="memory")
    with pytest.raises(objects.BlobError, match="are not in the object store 'personas'"):
        await objects.get_personas(js, "0" * 64)


async def test_a_blob_whose_chunks_hold_nothing_fails_within_its_deadline(js, monkeypatch):
    """nats-py's get() waits for an object's chunks without end: metadata naming chunks that
    hold nothing hung its reader. A read now has a deadline from the object's size."""
    import json
    import time

    data = b"persona\n" * 1000
    digest = await objects.put_personas(js, data)
    store = await js.object_store("personas")
    info = (await store.get_info(digest)).as_dict()
    info["nuid"] = "nothing-here"
    await js.publish(f"$O.personas.M.{objects_b64(digest)}", json.dumps(info).encode())
    monkeypatch.setattr(objects, "READ_BASE_S", 0.5)
    t0 = time.monotonic()
    with pytest.raises(objects.BlobError, match="did not come within"):
        await objects.get_personas(js, digest)
    assert time.monotonic() - t0 < 5


def objects_b64(name: str) -> str:
    import base64

    return base64.urlsafe_b64encode(name.encode()).decode()
