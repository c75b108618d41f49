"""Checkpoints on the bus: what a run needs to continue after a round, in the object store
`checkpoints` — its agents' declared state (one object per agent id range, written by the
host that played the range) and its environment's state and next observation (written by the
environment before it publishes the round's result; round opens name it by reference, so it is
where the state lives between rounds: `load_state`). A round that closed is therefore a round
that can be continued from: resume, fork and a host's replacement all start there.

The agents' state is columnar JSON: {"first": 0, "count": n, "fields": {"memory": [...]}}.
A range's checkpoint is either full (every agent) or a delta: only the agents whose state may
have changed since the range's previous checkpoint (those that acted), at offsets `changed`,
and `builds_on`, the name and sha256 of that previous checkpoint. A restore resolves the chain
back to its full base, verifying every link by the digest the next link carries (the head by
the one its round recorded), so a delta is exactly as trustworthy as a full checkpoint. Fields
named in `round_fields` (a round's posts) belong to the head's round only: an agent not in the
head has none. The object's metadata lists the chain's names (`needs`): pruning keeps them.

Every object is bound to its writer (populace.core.owned_objects): its metadata is on a subject
only its writer's NATS user may publish, and a reader looks for it under the writer it expects
— the share's host for an agents' object (the restore names it: `Restore.writers`), the
environment for its own state and worlds, the orchestrator for configs, a partial's host for a
partial — so a newest version forged under another user's token is never looked at. And a
host reports the sha256 of each object it stored in its round partial, the environment carries
those (and its own object's) in the round result, and the orchestrator keeps each share's own
ranges' in KV `runs`, which only it may write: a restore reads an object only against the digest
recorded for it (`CheckpointUnverified` otherwise)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from nats.js import JetStreamContext
from pydantic_core import from_json, to_json

from populace.core import subjects
from populace.core.bus import run_writers, stream_subjects, unless_reconnected, until_ready
from populace.core.checkpoint_rows import (  # the rows' format: re-exported, its home is pure
    MARKS,
    as_runs,
    changed_offsets,
    compacted,
    offsets_of,
    resolve_chain,
    valid_offsets,
)
from populace.core.contracts import LivingRef, StateRef, WorldRef
from populace.core.owned_objects import (
    CheckpointError,
    CheckpointMissing,
    CheckpointUnavailable,
    StoreFull,
    locate,
    read_meta,
    read_object,
    strays,
    write_object,
)

__all__ = [
    "MARKS",
    "CheckpointError",
    "CheckpointMissing",
    "CheckpointUnavailable",
    "CheckpointUnverified",
    "StoreFull",
    "as_runs",
    "changed_offsets",
    "compacted",
    "offsets_of",
    "resolve_chain",
]


class CheckpointUnverified(CheckpointError):
    """A checkpoint does not match the digest recorded when its round closed (or none was)."""


class Stored(NamedTuple):
    name: str
    size: int  # bytes
    digest: str  # sha256 of the bytes, hex


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# A checkpoint outlasts a NATS leader election (seconds): retried for about a minute before
# the round gives up on it.
ATTEMPTS = 35

ENV_WRITER = "environment"  # the environment's token: its state, worlds
CONFIG_WRITER = "orchestrator"  # the orchestrator's: a run's configs (populace.core.runconfigs)


def writer_of(name: str) -> str | None:
    """Who writes the object `name`, when its name says: the environment (its state, a world,
    who is alive), the orchestrator (a config), a share's host (its partial). None: an agents'
    object, whose writer is the host that played its range that round (the restore names it)."""
    kind = name.split(".")[2:3]
    if kind in (["env"], ["world"], ["population"]):
        return ENV_WRITER
    if kind == ["config"]:
        return CONFIG_WRITER
    if kind == ["partial"]:
        share = name.split(".", 3)[3]  # subjects.checkpoint_partial: <host>-<epoch>
        host, _, epoch = share.rpartition("-")
        return host if host and epoch.isdigit() else None
    return None


async def _stored(js: JetStreamContext, name: str, data: bytes, writer: str, needs: Iterable[str] = ()) -> None:
    # js._nc: the connection a JetStreamContext is made on (nats-py keeps no public name for it)
    await until_ready(lambda: unless_reconnected(js._nc, write_object(js, name, data, writer, needs)),
                      f"checkpoint {name}", attempts=ATTEMPTS)


async def put(js: JetStreamContext, name: str, value: object, *, writer: str, needs: Iterable[str] = ()) -> Stored:
    """Store a JSON value under `name`, written by `writer` (a host id, or `environment`);
    returns its size and digest (what the round's result records for it). StoreFull when the
    store refuses it."""
    data = to_json(value)
    await _stored(js, name, data, writer, needs)
    return Stored(name, len(data), digest(data))


async def put_bytes(js: JetStreamContext, name: str, data: bytes, *, writer: str) -> str:
    """Store raw bytes (a world's Arrow IPC, a partial too large for a message), written by
    `writer`; returns their sha256 (a reader uses the bytes only if they still have it)."""
    await _stored(js, name, data, writer)
    return digest(data)


async def _read(js: JetStreamContext, name: str, writer: str | None, max_bytes: int | None, expected: str) -> bytes:
    writer = writer or writer_of(name)
    if writer is None:
        raise CheckpointUnverified(f"checkpoint {name} has no writer recorded for it: it cannot be told from a "
                                   "forgery and is not used")
    return await read_object(js, name, writer, max_bytes, sha256=expected)


async def get_bytes(js: JetStreamContext, name: str, expected: str, *, writer: str | None = None,
                    max_bytes: int | None = None) -> bytes:
    """The bytes `writer` (by default, whoever the name says writes it: `writer_of`) stored under
    `name`, at most `max_bytes`, only if they still have the digest `expected`
    (CheckpointUnverified otherwise)."""
    data = await _read(js, name, writer, max_bytes, expected)
    found = digest(data)
    if found != expected:
        raise CheckpointUnverified(f"checkpoint {name} is not what was stored (sha256 {found[:12]}…, expected "
                                   f"{expected[:12]}…): it is not used")
    return data


async def save_world(js: JetStreamContext, rid: str, round_: int, data: bytes, *, writer: str) -> WorldRef:
    """A world after round `round_` (its Arrow IPC bytes), named and digested for the round's result."""
    name = subjects.checkpoint_world(rid, round_)
    return WorldRef(name=name, digest=await put_bytes(js, name, data, writer=writer))


async def load_world(js: JetStreamContext, ref: WorldRef) -> bytes:
    return await get_bytes(js, ref.name, ref.digest)


async def get(js: JetStreamContext, name: str, digests: Mapping[str, str], writer: str | None = None) -> object:
    """The JSON value `writer` (by default `writer_of(name)`) stored under `name`, if its bytes
    still have the digest `digests` records for it (CheckpointUnverified otherwise: it is never
    used)."""
    expected = digests.get(name)
    if expected is None:
        raise CheckpointUnverified(f"checkpoint {name} has no digest recorded for it (its writer reported none "
                                   "when the round closed): it cannot be verified and is not used")
    data = await _read(js, name, writer, None, expected)
    found = digest(data)
    if found != expected:
        raise CheckpointUnverified(f"checkpoint {name} was changed after its writer stored it (sha256 {found[:12]}…, "
                                   f"recorded {expected[:12]}… when its round closed): it is not used")
    try:
        return from_json(data)
    except ValueError as err:
        raise CheckpointError(f"checkpoint {name} is not valid JSON: {err}") from None


async def present(js: JetStreamContext, names: Iterable[str], writers: Mapping[str, str]) -> None:
    """CheckpointError naming the first of `names` (agents' objects, by the writers `writers`
    names) the object store no longer holds (pruned, or never written), with every checkpoint
    each builds on, without reading the objects (their metadata only)."""
    todo, seen = [(name, writers.get(name)) for name in names], set()
    while todo:  # with every checkpoint a delta among them builds on (its writer's own)
        name, writer = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        if writer is None:
            raise CheckpointUnverified(f"checkpoint {name} has no writer recorded for it: it is not used")
        try:
            info = await read_meta(js, name, writer)
        except CheckpointMissing:
            raise CheckpointError(f"checkpoint {name} is not in the object store '{subjects.CHECKPOINTS_BUCKET}' "
                                  "(pruned: POPULACE_CHECKPOINTS_KEEP keeps all of a completed run's by default)"
                                  ) from None
        todo.extend((below, writer) for below in info.needs)


# A chain longer than this is not one a writer made (it starts a full checkpoint every
# `checkpoint_full_every` rounds, at most 10,000): a loop of forged links stops here.
MAX_LINKS = 10_000


@dataclass
class Chain:
    """One range's checkpoints since its last full one, as their writer keeps them: what the
    next checkpoint builds on, and whether a full one is due instead."""
    links: list[Stored] = field(default_factory=list)  # the full base first, the head last

    def full_due(self, full_every: int, delta_ratio: float) -> bool:
        """Whether the next checkpoint must be full: no base yet, `full_every` links already (a
        restore reads at most that many), or the deltas together over `delta_ratio` × the base's
        bytes (a restore reads at most about 1 + delta_ratio bases)."""
        if not self.links:
            return True
        deltas = sum(link.size for link in self.links[1:])
        return len(self.links) >= full_every or deltas > delta_ratio * self.links[0].size

    def add(self, stored: Stored, full: bool) -> None:
        if full:
            self.links = [stored]
        else:
            self.links.append(stored)


async def save_agents(js: JetStreamContext, rid: str, round_: int, first: int, count: int,
                      fields: dict[str, list], *, writer: str, changed: list[int] | None = None,
                      chain: Chain | None = None, round_fields: Iterable[str] = (),
                      held: list[int] | None = None, marks: dict[str, object] | None = None) -> Stored:
    """One range's checkpoint after `round_`: full (`changed` None: `fields` hold every agent,
    or those at offsets `held`), or a delta on `chain`'s head (`fields` hold the agents at
    offsets `changed` only). The agents without a state of their own are offsets, not rows:
    `marks` ({"gone": …, "fresh": …}, each a list or its runs: `as_runs`), or, not given, the GONE
    and FRESH columns of `fields` (`compacted`)."""
    delta = changed is not None
    if marks is None:
        fields, rows, offsets = compacted(fields, count, changed)
        marks = {key: as_runs(at) for key, at in offsets.items()}
    else:
        rows = changed if delta else held
    value: dict[str, object] = {"first": first, "count": count, "fields": fields, **marks}
    if not delta and rows is not None:
        value["held"] = rows  # a full checkpoint whose marked agents have no rows: the offsets that do
    round_fields = sorted(round_fields)
    if round_fields:
        value["round_fields"] = round_fields
    needs: list[str] = []
    if delta:
        if chain is None or not chain.links:
            raise CheckpointError(f"a delta checkpoint of agents {first}.. after round {round_} needs the checkpoint "
                                  "it builds on")
        head = chain.links[-1]
        value["changed"] = changed
        value["builds_on"] = {"name": head.name, "digest": head.digest}
        needs = [link.name for link in chain.links]
    return await put(js, subjects.checkpoint_agents(rid, round_, first), value, writer=writer, needs=needs)


async def read_chain(js: JetStreamContext, name: str, digests: Mapping[str, str], first: int,
                     count: int, writer: str | None) -> list[dict]:
    """The chain of checkpoint values a range's checkpoint `name` resolves through, the head
    first: each link verified against the digest the link after it carries (the head against
    `digests`, as recorded when its round closed), all as `writer` stored them (a range's chain
    is one host's: a share that starts anew writes a full checkpoint first). A missing or changed
    link raises, naming it."""
    links: list[dict] = []
    expected = digests
    while True:
        if writer is None:
            raise CheckpointUnverified(f"checkpoint {name} has no writer recorded for it: it cannot be told from a "
                                       "forgery and is not used")
        value = await get(js, name, expected, writer)
        # the head holds the range; a link below may hold fewer agents (the range grew since, by newcomers)
        most = links[-1]["count"] if links else count
        held = value.get("count") if isinstance(value, dict) else None
        if not isinstance(value, dict) or value.get("first") != first or not isinstance(held, int) \
                or isinstance(held, bool) or not (0 < held <= most) or (not links and held != count) \
                or not isinstance(value.get("fields"), dict) \
                or not valid_offsets(value.get("held"), held) \
                or not all(key not in value or valid_offsets(offsets_of(value[key]), held) for key in MARKS):
            raise CheckpointError(f"checkpoint {name} does not hold agents {first}..{first + count - 1}")
        links.append(value)
        below = value.get("builds_on")
        if below is None:
            return links
        changed = value.get("changed")
        if not isinstance(below, dict) or not isinstance(below.get("name"), str) \
                or not isinstance(below.get("digest"), str) or not isinstance(changed, list) \
                or not all(isinstance(o, int) and 0 <= o < held for o in changed):
            raise CheckpointError(f"checkpoint {name} is a delta without a valid base reference or agent offsets")
        if len(links) >= MAX_LINKS:
            raise CheckpointError(f"checkpoint {name}'s chain is longer than {MAX_LINKS} links")
        name, expected = below["name"], {below["name"]: below["digest"]}


async def load_agents(js: JetStreamContext, rid: str, round_: int, layout: Iterable[tuple[int, int]],
                      wanted: Iterable[tuple[int, int]], digests: Mapping[str, str],
                      writers: Mapping[str, str]) -> dict[int, dict[str, object]]:
    """The state of every agent in `wanted` ranges, by agent id, read from the checkpoint
    objects of `layout` (the ranges the checkpoint was written in) that overlap them, each as
    its writer (`writers`: object name -> the host that played its range) stored it, verified
    against `digests` (object name -> sha256, as recorded when the round closed) and resolved
    through the deltas it builds on (each verified by the digest its successor carries)."""
    wanted = list(wanted)
    bounds = [(f, f + c) for f, c in wanted]
    out: dict[int, dict[str, object]] = {}
    async for first, count, fields in agent_chunks(js, rid, round_, layout, wanted, digests, writers):
        for offset in range(count):
            aid = first + offset
            if any(a <= aid < b for a, b in bounds):
                out[aid] = {name: values[offset] for name, values in fields.items()}
    return out


async def agent_chunks(js: JetStreamContext, rid: str, round_: int, layout: Iterable[tuple[int, int]],
                       wanted: Iterable[tuple[int, int]], digests: Mapping[str, str],
                       writers: Mapping[str, str]) -> AsyncIterator[tuple[int, int, dict[str, list]]]:
    """`load_agents`' checkpoint objects as they are stored, by columns: (first agent, count,
    {field: values}) for each range of `layout` that overlaps a `wanted` range (a reader that
    needs no dict per agent, e.g. a post-hoc interview of a million agents)."""
    wanted = [(f, f + c) for f, c in wanted]
    for first, count in layout:
        lo, hi = first, first + count
        if not any(a < hi and lo < b for a, b in wanted):
            continue
        name = subjects.checkpoint_agents(rid, round_, first)
        links = await read_chain(js, name, digests, first, count, writers.get(name))
        fields = resolve_chain(links, first, count)
        del links
        for name, values in fields.items():
            if len(values) != count:
                raise CheckpointError(f"checkpoint {subjects.checkpoint_agents(rid, round_, first)} has {len(values)} "
                                      f"values of {name!r} for agents {first}..{first + count - 1}")
        yield first, count, fields


async def save_env(js: JetStreamContext, rid: str, round_: int, state: dict, observation: dict,
                   selection: dict | None = None, world: WorldRef | None = None,
                   population: LivingRef | None = None, prototypes: dict[str, float] | None = None) -> Stored:
    # the objects it names may be an earlier round's (unchanged since): pruning keeps them with it
    needs = [ref.name for ref in (world, population) if ref is not None]
    value = {"state": state, "observation": observation, "selection": selection,
             "world": world.model_dump() if world is not None else None,
             "population": population.model_dump() if population is not None else None}
    if prototypes:  # only a prototype run whose guard raised a share: older checkpoints read alike
        value["prototypes"] = prototypes
    return await put(js, subjects.checkpoint_env(rid, round_), value, writer=ENV_WRITER, needs=needs)


class EnvCheckpoint(NamedTuple):
    state: dict
    observation: dict
    selection: dict | None  # who acts in the next round (None: everyone)
    world: WorldRef | None  # the world after the round (a simulation with one)
    population: LivingRef | None = None  # who is alive after the round (a run whose population changed)
    prototypes: dict[str, float] | None = None  # a prototype run: the shares its guard raised


async def load_env(js: JetStreamContext, rid: str, round_: int, digests: Mapping[str, str]) -> EnvCheckpoint:
    """The environment's state after `round_`, the next round's observation, who acts in it and its
    world, verified against `digests` (as recorded when the round closed)."""
    value = await get(js, subjects.checkpoint_env(rid, round_), digests)
    if not isinstance(value, dict) or not isinstance(value.get("state"), dict):
        raise CheckpointError(f"checkpoint {subjects.checkpoint_env(rid, round_)} is not an environment's state")
    selection, world, population = value.get("selection"), value.get("world"), value.get("population")
    raised = value.get("prototypes")
    return EnvCheckpoint(value["state"], value.get("observation") or {},
                         selection if isinstance(selection, dict) else None,
                         WorldRef.model_validate(world) if isinstance(world, dict) else None,
                         LivingRef.model_validate(population) if isinstance(population, dict) else None,
                         {str(k): float(v) for k, v in raised.items()} if isinstance(raised, dict) else None)


async def load_state(js: JetStreamContext, ref: StateRef) -> dict:
    """The environment's state a round open names (its checkpoint of a round, by digest)."""
    value = await get(js, ref.name, {ref.name: ref.digest}, writer=ENV_WRITER)
    if not isinstance(value, dict) or not isinstance(value.get("state"), dict):
        raise CheckpointError(f"checkpoint {ref.name} is not an environment's state")
    return value["state"]


async def save_population(js: JetStreamContext, rid: str, round_: int, data: bytes) -> str:
    """Who is alive after round `round_` (populace.sdk.population's bytes); returns their sha256."""
    return await put_bytes(js, subjects.checkpoint_population(rid, round_), data, writer=ENV_WRITER)


async def load_population(js: JetStreamContext, ref: LivingRef) -> bytes:
    return await get_bytes(js, ref.name, ref.digest)


Keep = Literal["all", "last", "none"]


def to_prune(rid: str, names: Iterable[str], keep: Keep, needs: Mapping[str, Iterable[str]] | None = None) -> list[str]:
    """The names among `names` (any runs' objects) that run `rid` no longer needs, keeping
    all of them, only its last round's (a fork from that round still works) with every
    checkpoint they build on (`needs`: name -> the names of its chain) and its configs (a few KB
    each: a post-hoc interview's order names the run's config by digest), or none."""
    rounds = {name: n for name in names if (n := subjects.checkpoint_round(rid, name)) is not None}
    if keep == "all" or not rounds:
        return []
    last = max(rounds.values())
    kept = {name for name, n in rounds.items() if keep != "none" and (n >= last or subjects.is_checkpoint_config(name))}
    todo = list(kept)
    while todo:  # a delta's chain: its metadata lists it all, but a link's own needs are kept too
        for below in (needs or {}).get(todo.pop(), ()):
            if below not in kept:
                kept.add(below)
                todo.append(below)
    return sorted(name for name in rounds if name not in kept)


async def run_objects(js: JetStreamContext, rid: str) -> dict[tuple[str, str], str]:
    """Run `rid`'s objects as the store holds them: (writer, name) -> its metadata subject."""
    listed = await until_ready(lambda: stream_subjects(js, subjects.CHECKPOINTS_STREAM,
                                                       subjects.checkpoint_run_meta(rid)), "checkpoints bucket")
    out = {}
    for subject in listed:
        at = locate(subject)
        if at.writer is not None and at.name is not None and at.rid == rid:
            out[(at.writer, at.name)] = subject
    return out


async def prune(js: JetStreamContext, rid: str, keep: Keep) -> int:
    """Delete run `rid`'s checkpoint objects that `keep` does not keep; returns how many names.
    Only for a run that will not be resumed: its last checkpoint is what a resume starts from.
    Chunks go by writer: all of a writer's that none of its kept objects needs (those below the
    first chunk of its oldest kept object: at most one chain's worth of older ones stays)."""
    if keep == "all":
        return 0
    stream = subjects.CHECKPOINTS_STREAM
    listed = await run_objects(js, rid)
    names = {name for _, name in listed}
    if keep == "none":
        await js.purge_stream(stream, subject=subjects.checkpoint_run_chunks(rid))
        await js.purge_stream(stream, subject=subjects.checkpoint_run_meta(rid))
        return len(names)
    writers: dict[str, list[str]] = {}
    for writer, name in listed:
        writers.setdefault(name, []).append(writer)
    rounds = {name: n for name in names if (n := subjects.checkpoint_round(rid, name)) is not None}
    last = max(rounds.values(), default=0)
    needs: dict[str, list[str]] = {}
    lowest: dict[str, int] = {}  # writer -> the first chunk of its oldest kept object
    todo = [name for name, n in rounds.items() if n >= last or subjects.is_checkpoint_config(name)]
    while todo:  # the kept objects and every link they build on, read from their metadata
        name = todo.pop()
        if name in needs:
            continue
        needs[name] = []
        for writer in writers.get(name, ()):
            try:
                meta = await read_meta(js, name, writer)
            except CheckpointError:
                continue
            if meta.chunks:
                lowest[writer] = min(lowest.get(writer, meta.first_seq), meta.first_seq)
            needs[name] += meta.needs
            todo += [below for below in meta.needs if below not in needs]
    dropped = to_prune(rid, names, keep, needs)
    # chunks first, then the metadata: a prune cut short leaves names a later prune finds again
    for writer in sorted({w for w, _ in listed}):
        await js.purge_stream(stream, subject=subjects.checkpoint_chunks(writer, rid), seq=lowest.get(writer))
    gone = set(dropped)
    for (_, name), subject in sorted(listed.items()):
        if name in gone:
            await js.purge_stream(stream, subject=subject)
    return len(dropped)


class Swept(NamedTuple):
    subjects: int  # subjects purged
    messages: int  # messages they held
    runs: list[str]  # the runs (or made-up run ids) they named


async def sweep(js: JetStreamContext) -> Swept:
    """Purge what belongs to no run from the store: objects of a run KV `runs` does not know
    (made up, or an attacker's), and objects of a run written by a user that is none of its
    writers (a host never placed in it). What a run's own writers stored stays (pruning is
    `prune`'s, by POPULACE_CHECKPOINTS_KEEP). A run's objects are written only after its state
    is in KV `runs`, and that state is read here after the listing, so nothing of a run being
    started is taken for a stray."""
    listed = await until_ready(lambda: stream_subjects(js, subjects.CHECKPOINTS_STREAM, subjects.CHECKPOINTS_ALL),
                               "checkpoints bucket")
    located = [locate(subject) for subject in listed]
    writers_of: dict[str, set[str] | None] = {}
    for rid in sorted({at.rid for at in located if at.rid is not None}):
        if not subjects.valid_token(rid):
            continue
        run = await run_writers(js, rid)
        if run is not None:
            writers_of[rid] = run.writers((ENV_WRITER, CONFIG_WRITER))
    stray = set(strays(located, writers_of))
    purges = set()
    for at in located:  # one purge per stray writer of a run (its chunks, its metadata), else per subject
        if at.subject in stray:
            whole = at.writer is not None and at.rid is not None and not at.legacy
            purges |= ({subjects.checkpoint_chunks(at.writer, at.rid), subjects.checkpoint_run_meta(at.rid, at.writer)}
                       if whole else {at.subject})
    for subject in sorted(purges):
        await js.purge_stream(subjects.CHECKPOINTS_STREAM, subject=subject)
    return Swept(len(stray), sum(listed[s] for s in stray),
                 sorted({at.rid or "?" for at in located if at.subject in stray}))


def recorded(rid: str, round_: int, claims: Mapping[str, Mapping[str, str]], env_digest: str | None,
             ranges_of: Mapping[str, Iterable[tuple[int, int]]]) -> tuple[dict[str, str], list[str]]:
    """The digests to record for round `round_`'s checkpoint objects: each share's claims
    (share key -> object name -> sha256, from its partial) for the objects of its own ranges
    (`ranges_of`: share key -> its ranges) only, and the environment's. Returns them, and
    why any claim was left out (a share naming another share's object, or one it does not
    play): the object's reader then finds no digest, never another share's."""
    out: dict[str, str] = {}
    if env_digest is not None:
        out[subjects.checkpoint_env(rid, round_)] = env_digest
    dropped: list[str] = []
    for key, names in sorted(claims.items()):
        own = {subjects.checkpoint_agents(rid, round_, first) for first, _ in ranges_of.get(key, ())}
        for name, value in sorted(names.items()):
            if name in own:
                out[name] = value
            else:
                dropped.append(f"share {key} reported a digest of {name}, which is not one of its ranges' objects")
    return out, dropped
