"""A graph stored once in the `graphs` object store by digest, read back and checked."""

from __future__ import annotations

import numpy as np
import pytest

from populace.graph import GraphError, digest, dumps, small_world
from populace.graph.store import GRAPHS_BUCKET, get_graph, put_graph

pytestmark = pytest.mark.integration


async def test_put_once_get_checked(js):
    g = small_world(2000, 6, 0.2, seed=1)
    key = await put_graph(js, g)
    assert key == digest(dumps(g))
    assert await put_graph(js, dumps(g)) == key  # already there: stored once
    back = await get_graph(js, key)
    assert np.array_equal(back.offsets, g.offsets) and np.array_equal(back.sources, g.sources)
    store = await js.object_store(GRAPHS_BUCKET)
    await store.put("f" * 64, dumps(g))  # bytes under a name that is not their digest
    with pytest.raises(GraphError, match="do not match their digest"):
        await get_graph(js, "f" * 64)
    with pytest.raises(GraphError, match="is not in the object store"):
        await get_graph(js, "0" * 64)
