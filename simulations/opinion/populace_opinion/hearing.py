"""What an agent hears in a round, pure: which of the messages in its inbox it reads in its
prompt, and the sums over its in-neighbours' stances that the environment folds.

An inbox holds the in-neighbours' posts of the round before (by author id) and, in a round
the scenario schedules one, broadcasts (author BROADCAST: a campaign, a rumour; not an agent,
so never part of the statistics over the graph's edges).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from populace.sdk import BROADCAST_AUTHOR, Message
from populace_opinion.scale import MICRO, to_micro

BROADCAST = BROADCAST_AUTHOR  # the author of a broadcast (-1): the platform's


class Reading(NamedTuple):
    """The messages an agent reads in its prompt, each kind in inbox order."""

    broadcasts: tuple[Message, ...]
    posts: tuple[Message, ...]  # in-neighbours' posts read
    posts_heard: int  # in-neighbours' posts heard, read or not


class Listened(NamedTuple):
    """Sums over the stances of the in-neighbours' posts an agent heard (posts whose stance is
    on the scale; broadcasts never), in micro-units: exact, so the environment can fold them."""

    n: int = 0
    total: int = 0
    squares: int = 0

    @property
    def mean(self) -> float | None:
        return self.total / (self.n * MICRO) if self.n else None


NOTHING_HEARD = Listened()


_UNSET = object()


def listen(messages: Sequence[Message]) -> Listened:
    n = total = squares = 0
    for m in messages:
        if m.author == BROADCAST:
            continue
        post = m.post
        micro = getattr(post, "micro", _UNSET)  # a Say derived it once; another post (a test's) not
        if micro is _UNSET:
            micro = to_micro(getattr(post, "stance", None))
        if micro is None:
            continue
        n += 1
        total += micro
        squares += micro * micro
    return Listened(n, total, squares)


def read(messages: Sequence[Message], cap: int, seed: int, round_: int, agent_id: int) -> Reading:
    """At most `cap` messages: every broadcast first (the scenario sent it to be read), then
    the in-neighbours' posts. When there are more posts than room, a sample seeded by the run's
    seed, the round and the agent: reproducible on any host, and not biased to low author ids
    the way the inbox's first posts would be."""
    broadcasts = [m for m in messages if m.author == BROADCAST]
    posts = [m for m in messages if m.author != BROADCAST]
    heard = len(posts)
    room = cap - len(broadcasts)
    if room <= 0:
        return Reading(tuple(broadcasts[:cap]), (), heard)
    if heard > room:
        # A seeded sample without a Random per agent per round (seeding Mersenne Twister costs
        # ~8 µs): rank the posts by the hash of (run seed, round, agent, index). Hashes of ints
        # and tuples of ints are the same in every process (no PYTHONHASHSEED), so every host
        # and the local runner pick the same posts.
        key = hash((seed, round_, agent_id))
        keep = sorted(sorted(range(heard), key=lambda i: hash((key, i)))[:room])
        posts = [posts[i] for i in keep]
    return Reading(tuple(broadcasts), tuple(posts), heard)
