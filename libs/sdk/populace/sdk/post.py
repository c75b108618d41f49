"""What an agent says to the agents that hear it: one post per agent per round.

A simulation whose scenario has a `graph:` declares its post (text plus its own structured
fields) and its agents set `outcome.post`; in the next round every agent reads its
in-neighbours' posts with `obs.inbox(self.id)`:

    class Say(Post):
        stance: float = 0.0      # text is the base's

    class Opinion(Simulation):
        Post = Say

    async def turn(self, obs, llm):
        heard = obs.inbox(self.id)          # (Message(author, post), …), by author id
        …
        return Stance(value=s, post=Say(text=sentence, stance=s))

Like an outcome, a post is a plain keyword-only dataclass (a host makes a million per round);
its fields are JSON values. The platform stores each post once per author per round (table
`posts`); who hears whom is the graph.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from json.encoder import encode_basestring
from typing import Any, NamedTuple, dataclass_transform

# A post travels in every hearer's host's mail and is stored once per round: a bound keeps one
# runaway answer from filling a mail message (NATS refuses payloads over 1 MB).
MAX_TEXT = 10_000


@dataclass_transform(kw_only_default=True)
class Post:
    """Base of every simulation's post: `text`, plus the fields a subclass declares (each
    with a default)."""

    text: str = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(kw_only=True)(cls)


Post = dataclasses.dataclass(kw_only=True)(Post)  # type: ignore[misc]


class Message(NamedTuple):
    """One post an agent hears: who wrote it (an agent id) and what."""

    author: int
    post: Post


class PostError(ValueError):
    """A post that cannot travel or be stored (wrong type, a field that is not JSON)."""


@functools.cache  # a class's fields do not change; asked once per post read off the wire
def post_fields(cls: type[Post]) -> tuple[str, ...]:
    """The structured fields of a post class (everything but `text`)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.name != "text")


def _finite(value: Any, where: str) -> None:
    stack = [value]
    while stack:
        x = stack.pop()
        if isinstance(x, float) and not math.isfinite(x):
            raise PostError(f"{where}: numbers must be finite (got {x!r})")
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list | tuple):
            stack.extend(x)


_SCALARS = frozenset({str, int, bool, type(None)})


def to_wire(post: Post, cls: type[Post], names: tuple[str, ...]) -> tuple[str, dict]:
    """(text, fields) of a post, checked: the simulation's post class, text a string, fields
    JSON with finite numbers. Raises PostError naming the field."""
    if not isinstance(post, cls):
        raise PostError(f"outcome.post: {type(post).__name__} is not the simulation's {cls.__name__}")
    text = post.text
    if not isinstance(text, str):
        raise PostError(f"outcome.post.text: must be a string (got {type(text).__name__})")
    if len(text) > MAX_TEXT:
        raise PostError(f"outcome.post.text: {len(text):,} characters; a post holds at most {MAX_TEXT:,}")
    fields = {name: getattr(post, name) for name in names}
    for value in fields.values():
        kind = value.__class__
        if kind is float:
            if not math.isfinite(value):
                raise PostError(f"outcome.post: numbers must be finite (got {value!r})")
        elif kind not in _SCALARS:  # nested values: the slow, complete check
            try:
                json.dumps(fields)
            except (TypeError, ValueError) as err:
                raise PostError(f"outcome.post: its fields must be JSON values ({err})") from None
            _finite(fields, "outcome.post")
            break
    return text, fields


def from_wire(cls: type[Post], text: str, fields: dict | None) -> Post:
    """The post a wire or checkpoint row holds (unknown fields are ignored, missing ones take
    their defaults: a post written by an older version of the simulation still reads)."""
    if not fields:
        return cls(text=text)
    names = post_fields(cls)
    if all(k in names for k in fields):
        return cls(text=text, **fields)
    return cls(text=text, **{k: v for k, v in fields.items() if k in names})


def fields_json(fields: dict | None) -> str:
    """A post's fields as compact JSON with sorted keys: what its digest is taken over, and
    how a mailbox keeps them (a short string, not a dict per post). A flat dict of strings,
    finite floats and ints (every post of the built-ins) is written directly, as json.dumps
    would: this runs once per post on every host that holds it."""
    if not fields:
        return "{}"
    body = _flat_json(fields)
    return body if body is not None else json.dumps(fields, sort_keys=True, separators=(",", ":"),
                                                    ensure_ascii=False)


def canonical(author: int, text: str, fields: dict | None, body: str | None = None) -> bytes:
    """The bytes a post's digest is taken over: the same on every host and from DuckDB
    (`body`: `fields_json(fields)` when already known)."""
    return f"{author}\x1f{text}\x1f{body if body is not None else fields_json(fields)}".encode()


def _flat_json(fields: dict) -> str | None:
    parts = []
    for key in sorted(fields):
        v = fields[key]
        kind = v.__class__
        if kind is float:
            text = float.__repr__(v)
        elif kind is str:
            text = encode_basestring(v)
        elif kind is int:
            text = int.__repr__(v)
        else:
            return None  # bool, None, nested: json.dumps
        if key.__class__ is not str:
            return None
        parts.append(f"{encode_basestring(key)}:{text}")
    return "{" + ",".join(parts) + "}"


def post_hash(author: int, text: str, fields: dict | None, body: str | None = None) -> int:
    """A post's 63-bit digest. What an agent heard is recorded as the sum (mod 2**63) of the
    digests of the posts in its inbox, so a test can recompute from DuckDB that every inbox
    held exactly its in-neighbours' posts of the round before."""
    data = canonical(author, text, fields, body)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") >> 1
