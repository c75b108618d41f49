"""The canonical bytes of a graph and their sha256: a graph is stored once (object store, by
digest, like personas) and named in the run's manifest.

Layout (all little-endian)::

    b"POPGRAPH"  u32 version (1)  u32 header length  header (JSON, sorted keys, no spaces)
    offsets  int64 × (n+1)
    sources  int32 × entries
    weights  float32 × entries          (only when header.weighted)

The header is ``{"directed": bool, "entries": int, "n": int, "weighted": bool}``. Rows are
sorted and free of repeats (as :func:`from_edges` builds them), so equal graphs have equal
bytes and equal digests. Not npz: numpy's zip members carry the time they were written.
:func:`loads` checks everything it reads (a digest when given, the sizes, the offsets, the ids).
"""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np

from populace.graph.config import GraphError
from populace.graph.csr import Graph

__all__ = ["FORMAT_VERSION", "MAGIC", "digest", "dumps", "loads"]

MAGIC = b"POPGRAPH"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sII")


def dumps(graph: Graph) -> bytes:
    header = json.dumps({"directed": graph.directed, "entries": graph.entries, "n": graph.n,
                         "weighted": graph.weights is not None}, sort_keys=True, separators=(",", ":")).encode()
    parts = [_PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)), header,
             graph.offsets.astype("<i8", copy=False).tobytes(),
             graph.sources.astype("<i4", copy=False).tobytes()]
    if graph.weights is not None:
        parts.append(graph.weights.astype("<f4", copy=False).tobytes())
    return b"".join(parts)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def loads(data: bytes, expect_digest: str | None = None) -> Graph:
    """The graph in `data`, checked; with `expect_digest`, the bytes must hash to it."""
    if expect_digest is not None and digest(data) != expect_digest:
        raise GraphError(f"graph {expect_digest}: stored bytes do not match their digest")
    if len(data) < _PREFIX.size:
        raise GraphError("graph: not a Populace graph (too short)")
    magic, version, hlen = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise GraphError("graph: not a Populace graph (bad magic)")
    if version != FORMAT_VERSION:
        raise GraphError(f"graph: format version {version} is not supported (this build reads {FORMAT_VERSION})")
    try:
        head = json.loads(data[_PREFIX.size:_PREFIX.size + hlen])
        n, entries = int(head["n"]), int(head["entries"])
        directed, weighted = bool(head["directed"]), bool(head["weighted"])
    except (ValueError, KeyError, TypeError):
        raise GraphError("graph: unreadable header") from None
    at = _PREFIX.size + hlen
    size = at + 8 * (n + 1) + (8 if weighted else 4) * entries
    if n < 1 or entries < 0 or len(data) != size:
        raise GraphError(f"graph: {len(data)} bytes, expected {size} for n={n}, entries={entries}")
    offsets = np.frombuffer(data, dtype="<i8", count=n + 1, offset=at)
    at += offsets.nbytes
    sources = np.frombuffer(data, dtype="<i4", count=entries, offset=at)
    at += sources.nbytes
    weights = np.frombuffer(data, dtype="<f4", count=entries, offset=at) if weighted else None
    if offsets[0] != 0 or offsets[-1] != entries or (np.diff(offsets) < 0).any():
        raise GraphError("graph: offsets are not a CSR index")
    if entries and (sources.min() < 0 or sources.max() >= n):
        raise GraphError("graph: an in-neighbour is not an agent id")
    # rows ascending without repeats: within a row each next source is larger
    step = np.diff(sources.astype(np.int64))
    row_start = np.zeros(entries, dtype=bool)
    row_start[offsets[:-1][offsets[:-1] < entries]] = True
    if entries > 1 and (step[~row_start[1:]] <= 0).any():
        raise GraphError("graph: a row is not sorted or repeats a source")
    return Graph(n=n, offsets=offsets, sources=sources, weights=weights, directed=directed)
