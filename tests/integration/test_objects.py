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
