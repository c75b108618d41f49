"""A graph on the bus: stored once in the `graphs` object store under the sha256 of its
canonical bytes (:mod:`populace.graph.serial`), read back and checked by every reader — the
way personas are (populace.core.objects).

The services create the bucket (``bus.provision``); the client writes graphs, agent-hosts read
them (deploy/nats/auth.conf).
"""

from __future__ import annotations

from populace.core.extras import fleet_missing

try:  # the fleet's libraries: an author's `populace-sdk` alone has none (populace.core.extras)
    from nats.js import JetStreamContext
    from nats.js.errors import NotFoundError, ObjectNotFoundError

    from populace.core.bus import until_ready
    from populace.core.objects import put_once, read_object
except ModuleNotFoundError as missing:
    raise fleet_missing("populace.graph.store (graphs in the fleet's object store)", missing,
                        extra="populace-graph[fleet]") from missing

from populace.core import subjects
from populace.graph.config import GraphError
from populace.graph.csr import Graph
from populace.graph.serial import digest, dumps, loads

__all__ = ["GRAPHS_BUCKET", "get_graph", "put_blob", "put_graph"]

GRAPHS_BUCKET = subjects.GRAPHS_BUCKET


async def put_graph(js: JetStreamContext, graph: Graph | bytes) -> str:
    """Store a graph (once: an identical one is already there) and return its digest."""
    data = graph if isinstance(graph, bytes) else dumps(graph)
    key = digest(data)
    store = await until_ready(lambda: js.object_store(GRAPHS_BUCKET), f"object store {GRAPHS_BUCKET}")
    await put_once(store, key, data, "graph")
    return key


async def put_blob(js: JetStreamContext, data: bytes, what: str) -> str:
    """Store bytes that belong with a graph (its agent order) under their sha256."""
    key = digest(data)
    store = await until_ready(lambda: js.object_store(GRAPHS_BUCKET), f"object store {GRAPHS_BUCKET}")
    await put_once(store, key, data, what)
    return key


async def get_graph(js: JetStreamContext, key: str) -> Graph:
    """The graph stored under `key`, its bytes checked against the digest."""
    try:
        store = await js.object_store(GRAPHS_BUCKET)
        data = await until_ready(lambda: read_object(store, key), f"graph {key[:12]}")
    except (NotFoundError, ObjectNotFoundError):
        raise GraphError(f"graph {key} is not in the object store '{GRAPHS_BUCKET}' "
                         "(uploaded to another NATS?)") from None
    return loads(data, expect_digest=key)
