"""Who hears what, pure: a round's posts by author, what each agent's inbox holds, which
authors' posts another share of the run needs, and whether a round's mail from the other
shares is all in. The agent-host and the local runner do the I/O around these.

Round n's inbox of agent `a` is the round n-1 posts of `a`'s in-neighbours in the run's graph
(those that posted). Posts of a host's own agents never leave it; for every other share the
host sends, once per round, the posts of its authors that share's agents hear.

A simulation that declares edge kinds (populace.sdk.edges) changes the graph as it runs: an
agent's follows and unfollows of the first kind made up to round n-1 count in its round n inbox,
as `following` counts them in a view. Its edits live with it, on its own host, so no host can
know which of its authors another share's agents follow now: such a run's hosts send every post
to every share (one message per host pair per round still), and each reader keeps its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from populace.graph.csr import Graph
from populace.sdk.edges import EdgeBook
from populace.sdk.post import Message, Post, fields_json, from_wire, post_hash

_MASK63 = np.uint64(2**63 - 1)


class Mailbox:
    """One round's posts, by author id (the whole run's id space: a host fills in its own
    agents' posts and those other hosts sent it), and the broadcasts agents read with them."""

    __slots__ = ("bodies", "edges", "extra", "graph", "has", "hashes", "post_cls", "posts", "round", "texts")

    def __init__(self, graph: Graph, post_cls: type[Post], round_: int, edges: EdgeBook | None = None) -> None:
        self.graph = graph
        # a graph that changes: who an agent hears is the graph plus its edits up to this round
        self.edges = edges
        self.post_cls = post_cls
        self.round = round_
        n = graph.n
        self.posts: list[Post | None] = [None] * n  # built from the wire form when first read
        self.texts: list[str | None] = [None] * n
        # each post's fields as compact JSON (post.fields_json): ~60 bytes, where a dict per post
        # took ~230 — a host keeps two rounds of a million posts
        self.bodies: list[str | None] = [None] * n
        self.hashes = np.zeros(n, dtype=np.uint64)
        self.has = np.zeros(n, dtype=bool)
        # broadcasts: (who hears it: a mask, None for everyone; the message)
        self.extra: list[tuple[np.ndarray | None, Message]] = []

    def put(self, author: int, post: Post | None, text: str, fields: dict | None) -> None:
        """`post` is what agents read (None: built from `text` and `fields` when first read)."""
        self.put_json(author, post, text, fields_json(fields))

    def put_json(self, author: int, post: Post | None, text: str, body: str) -> None:
        """`put` with the fields already as compact sorted JSON (a checkpoint keeps them so)."""
        self.posts[author] = post
        self.texts[author] = text
        self.bodies[author] = body
        self.hashes[author] = post_hash(author, text, None, body)
        self.has[author] = True

    def put_wire(self, authors: Iterable[int], texts: Iterable[str], fields: Iterable[dict | None]) -> int:
        """Posts as they travel (a mail batch): returns how many."""
        k = 0
        for a, t, f in zip(authors, texts, fields, strict=True):
            self.put(a, None, t, f)
            k += 1
        return k

    def wire(self, author: int) -> tuple[str, dict | None]:
        """A post as it travels: its text and its fields."""
        body = self.bodies[author]
        return self.texts[author], (json.loads(body) if body and body != "{}" else None)  # type: ignore[return-value]

    def post(self, author: int) -> Post | None:
        p = self.posts[author]
        if p is None and self.has[author]:
            text, fields = self.wire(author)
            p = self.posts[author] = from_wire(self.post_cls, text, fields)
        return p

    def sources(self, agent_id: int) -> list[int]:
        """Whose posts `agent_id` hears from this mailbox: its in-neighbours, with its edits made
        up to this round (an edit takes effect from the next round on)."""
        edges = self.edges
        if edges is not None and agent_id in edges.edits:
            return list(edges.following(agent_id, as_of=self.round))
        g = self.graph
        # Python lists, not numpy, inside the loop: indexing an array with an int costs ~100 ns
        return g.sources[g.offsets[agent_id]:g.offsets[agent_id + 1]].tolist()

    def inbox(self, agent_id: int) -> tuple[Message, ...]:
        texts, posts = self.texts, self.posts
        out = [m for mask, m in self.extra if mask is None or mask[agent_id]] if self.extra else []
        for s in self.sources(agent_id):
            if texts[s] is not None:
                out.append(Message(s, posts[s] or self.post(s)))  # type: ignore[arg-type]
        return tuple(out)
    def heard(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(posts heard, digest) of each agent of `ids`: the count of its in-neighbours with a
        post here, and the sum of their posts' digests mod 2**63 (see `post_hash`). Broadcasts
        are not counted: they are the scenario's, not the graph's."""
        g = self.graph
        ids = np.asarray(ids, dtype=np.int64)
        starts, ends = g.offsets[ids], g.offsets[ids + 1]
        lens = ends - starts
        total = int(lens.sum())
        bounds = np.zeros(ids.size + 1, dtype=np.int64)
        np.cumsum(lens, out=bounds[1:])
        # the concatenated rows of `ids` in the CSR, without a Python loop
        idx = np.arange(total, dtype=np.int64) + np.repeat(starts - bounds[:-1], lens)
        src = g.sources[idx]
        have = self.has[src]
        h = np.where(have, self.hashes[src], np.uint64(0))
        csum = np.zeros(total + 1, dtype=np.uint64)
        np.cumsum(h, dtype=np.uint64, out=csum[1:])  # wraps mod 2**64: differences stay exact mod 2**63
        ccount = np.zeros(total + 1, dtype=np.int64)
        np.cumsum(have, out=ccount[1:])
        counts = ccount[bounds[1:]] - ccount[bounds[:-1]]
        digests = ((csum[bounds[1:]] - csum[bounds[:-1]]) & _MASK63).astype(np.int64)
        edited = self.edges.edits if self.edges is not None else None
        if edited:  # agents whose in-edges changed: counted one by one from what they follow now
            for i, aid in enumerate(ids.tolist()):
                if aid in edited:
                    src = np.asarray(self.sources(aid), dtype=np.int64)
                    have = self.has[src]
                    counts[i] = int(have.sum())
                    digests[i] = int(np.sum(self.hashes[src][have], dtype=np.uint64) & _MASK63)
        return counts, digests


def owned_mask(n: int, ranges: Iterable[tuple[int, int]]) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    for first, count in ranges:
        mask[first:first + count] = True
    return mask


def route(graph: Graph, own: np.ndarray, shares: Mapping[str, Iterable[tuple[int, int]]]) -> dict[str, np.ndarray]:
    """For each other share (key -> its agent ranges), the authors among `own` (a mask of this
    host's agents) whose posts its agents hear, ascending. Every share is listed, even with
    none: the receiver counts on one message from each."""
    out: dict[str, np.ndarray] = {}
    for key, ranges in shares.items():
        parts = [graph.sources[graph.offsets[f]:graph.offsets[f + c]] for f, c in ranges if c > 0]
        heard = np.concatenate(parts) if parts else np.empty(0, dtype=np.int32)
        out[key] = np.unique(heard[own[heard]]) if heard.size else np.empty(0, dtype=np.int32)
    return out


@dataclass
class MailIn:
    """A round's mail to one share, as it arrives: shard `i` of `of` from each source share.
    Duplicates (a redelivery, a re-send) are recognised by (source, shard) and ignored."""

    round: int
    shards: dict[str, dict[int, Any]] = field(default_factory=dict)  # source key -> shard -> payload
    of: dict[str, int] = field(default_factory=dict)  # source key -> its shard count

    def add(self, source: str, shard: int, of: int, payload: Any) -> bool:
        """False when this shard was here already (or contradicts the count its source gave)."""
        known = self.of.setdefault(source, of)
        if known != of or not 0 <= shard < of:
            return False
        got = self.shards.setdefault(source, {})
        if shard in got:
            return False
        got[shard] = payload
        return True

    def missing(self, expected: Iterable[str]) -> list[str]:
        """The expected sources whose shards are not all in."""
        return [s for s in expected if len(self.shards.get(s, ())) != self.of.get(s, -1)]

    def payloads(self, expected: Iterable[str]) -> Iterator[Any]:
        """Every shard of the expected sources (mail from a share that no longer counts, e.g.
        one replaced mid-round, is left out)."""
        for s in expected:
            yield from self.shards.get(s, {}).values()
