"""One run's messages on one process: the mailbox agents read each round, where their own
posts go, what to send the other shares and what they sent. No I/O: the agent-host moves the
mail over NATS, the local runner has every agent in one mailroom.

Rounds: agents read in round n the mailbox of round n-1's posts (plus round n's broadcasts)
and their posts go into round n's mailbox, which other shares' mail for round n completes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from populace.core.contracts import Broadcast
from populace.graph.csr import Graph
from populace.sdk.edges import EdgeBook
from populace.sdk.mailbox import Mailbox, MailIn, owned_mask, route
from populace.sdk.post import Message, Post, PostError, from_wire, post_fields, to_wire

BROADCAST_AUTHOR = -1  # who a broadcast is from, as agents read it
SHARD_BYTES = 256 * 1024  # a mail message's posts stay well under NATS's 1 MB payload


@dataclass(slots=True)
class Outgoing:
    """Posts one share sends another in a round: shard `shard` of `shards`."""

    to: str
    shard: int
    shards: int
    authors: list[int]
    texts: list[str]
    fields: list[dict | None]


class Mailroom:
    def __init__(self, graph: Graph, post_cls: type[Post], own_ranges: Iterable[tuple[int, int]],
                 broadcasts: Sequence[Broadcast] = (), edges: EdgeBook | None = None) -> None:
        self.graph = graph
        # the graph changes (the simulation declares edge kinds): every post goes to every share
        self.edges = edges
        self.post_cls = post_cls
        self.own = owned_mask(graph.n, own_ranges)
        self.boxes: dict[int, Mailbox] = {}
        self.mail: dict[int, MailIn] = {}
        self.routed: dict[int, set[str]] = {}  # round -> destination shares its posts went to
        self.played: set[int] = set()  # rounds whose own posts are all in
        self.restored: set[int] = set()  # rounds whose posts came whole from a checkpoint
        self._names = post_fields(post_cls)
        self._broadcasts = list(broadcasts)

    # -- what agents read ----------------------------------------------------------------
    def box(self, round_: int) -> Mailbox:
        """Round `round_`'s posts (created empty when first asked)."""
        box = self.boxes.get(round_)
        if box is None:
            box = self.boxes[round_] = Mailbox(self.graph, self.post_cls, round_, self.edges)
        return box

    def reading(self, round_: int) -> Mailbox:
        """The mailbox agents read in `round_`: round_-1's posts, with round_'s broadcasts."""
        box = self.box(round_ - 1)
        box.extra = [self._broadcast(b) for b in self._broadcasts if b.round == round_]
        return box

    def _broadcast(self, b: Broadcast) -> tuple[np.ndarray | None, Message]:
        post = from_wire(self.post_cls, b.text, b.fields)
        if b.to == "all":
            return None, Message(BROADCAST_AUTHOR, post)
        mask = np.zeros(self.graph.n, dtype=bool)
        if b.to == "agents":
            mask[list(b.agents or ())] = True
        else:  # top-degree: those heard by the most agents (ties: the lower id)
            heard_by = self.graph.out_degree()
            top = np.lexsort((np.arange(self.graph.n), -heard_by))[:b.count]
            mask[top] = True
        return mask, Message(BROADCAST_AUTHOR, post)

    # -- own posts -------------------------------------------------------------------------
    def record(self, round_: int, reading: Mailbox, ids: Sequence[int], outs: Sequence,
               errors: list[str | None], valid: list[bool]) -> dict[str, list]:
        """Put a batch's posts into round `round_`'s mailbox and return the batch's post columns:
        each agent's post (text None: none) and what it heard (`reading`). A post that cannot
        travel makes its row invalid with the reason, as a bad outcome value does."""
        box = self.box(round_)
        texts: list[str | None] = []
        fields: list[dict | None] = []
        cls, names = self.post_cls, self._names
        for i, (aid, out) in enumerate(zip(ids, outs, strict=True)):
            post = getattr(out, "post", None)
            if post is None:
                texts.append(None)
                fields.append(None)
                continue
            try:
                text, f = to_wire(post, cls, names)
            except PostError as err:
                errors[i] = errors[i] or f"agent: {err}"
                valid[i] = False
                out.valid = False
                texts.append(None)
                fields.append(None)
                continue
            box.put(aid, post, text, f)
            texts.append(text)
            fields.append(f)
        heard, digest = reading.heard(np.asarray(ids, dtype=np.int64))
        return {"texts": texts, "fields": fields, "heard": heard.tolist(), "heard_digest": digest.tolist()}

    # -- mail out ----------------------------------------------------------------------------
    def outgoing(self, round_: int, shares: Mapping[str, Iterable[tuple[int, int]]],
                 me: Iterable[str]) -> list[Outgoing]:
        """Round `round_`'s mail to every share of `shares` not yet sent to (and not one of
        `me`): each gets at least one message, sharded under SHARD_BYTES."""
        sent = self.routed.setdefault(round_, set())
        mine = set(me)
        targets = {k: r for k, r in shares.items() if k not in mine and k not in sent}
        if not targets:
            return []
        box = self.box(round_)
        out: list[Outgoing] = []
        if self.edges is None:
            routes = route(self.graph, self.own & box.has, targets)
        else:  # anyone may follow any author by now: each share gets all of them
            everyone = np.flatnonzero(self.own & box.has)
            routes = dict.fromkeys(targets, everyone)
        for key, authors in routes.items():
            shards: list[tuple[list[int], list[str], list[dict | None]]] = [([], [], [])]
            size = 0
            for a in authors.tolist():
                text, f = box.wire(a)
                cost = len(text) * 2 + (len(f) * 24 if f else 0) + 16
                if size + cost > SHARD_BYTES and shards[-1][0]:
                    shards.append(([], [], []))
                    size = 0
                shards[-1][0].append(a)
                shards[-1][1].append(text)
                shards[-1][2].append(f)
                size += cost
            out.extend(Outgoing(key, i, len(shards), *parts) for i, parts in enumerate(shards))
            sent.add(key)
        return out

    # -- mail in -----------------------------------------------------------------------------
    def receive(self, round_: int, source: str, shard: int, shards: int, payload: object) -> bool:
        """Keep a shard of mail (False: a duplicate; it changes nothing)."""
        inbox = self.mail.get(round_)
        if inbox is None:
            inbox = self.mail[round_] = MailIn(round_)
        return inbox.add(source, shard, shards, payload)

    def missing(self, round_: int, sources: Iterable[str]) -> list[str]:
        """The sources whose mail for `round_` is not all in."""
        return (self.mail.get(round_) or MailIn(round_)).missing(sources)

    def deliver(self, round_: int, sources: Mapping[str, Iterable[tuple[int, int]]]) -> tuple[int, int]:
        """Put the expected sources' mail for `round_` (source key -> its agent ranges) into
        its mailbox, once complete. Returns (posts kept, posts refused): a post whose author is
        not one of its sender's agents is refused (a forged or misrouted message)."""
        box = self.box(round_)
        inbox = self.mail.get(round_)
        kept = refused = 0
        if inbox is None:
            return 0, 0
        for key, ranges in sources.items():
            theirs = owned_mask(self.graph.n, ranges)
            for authors, texts, fields in inbox.payloads([key]):
                for a, t, f in zip(authors, texts, fields, strict=True):
                    if 0 <= a < self.graph.n and theirs[a]:
                        box.put(a, None, t, f)
                        kept += 1
                    else:
                        refused += 1
        return kept, refused

    def forget_before(self, round_: int) -> None:
        """Rounds before `round_` are read no more."""
        for store in (self.boxes, self.mail, self.routed):
            for r in [r for r in store if r < round_]:
                del store[r]
        self.played = {r for r in self.played if r >= round_}
