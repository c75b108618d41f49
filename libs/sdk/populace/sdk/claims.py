"""Exclusive claims: agents claim targets — cells of a grid, seats, resources, anything numbered
0..size-1 — and each target goes to one claimant, by a seeded rule that depends on neither
placement nor arrival order, so one process, the fleet and a resumed run grant the same.

Claims meet where the round is decided: a turn says what its agent claims (an outcome column),
the environment's `reduce` gathers them into a `Claims` column of its partial, `merge`
concatenates, and `decide` grants them:

    from populace.sdk.claims import Claims

    class Moves(Partial):
        claims: Claims = Field(default_factory=Claims)

    def reduce(self, agent_ids, outcomes):                # on the hosts
        return Moves(claims=Claims.of(agent_ids, [o.to if o.valid else None for o in outcomes]))
        # or Claims.ranked(agent_ids, [o.choices for o in outcomes]): each agent's targets, best first
    def merge(self, partials):
        return Moves(claims=Claims.merge(p.claims for p in partials))
    def decide(self, state, round, total, world):
        won = total.claims.grant(world.sizes["cells"], seed=self.sim.seed, round=round,
                                 holder=world.occupant, what="cell")
        cell, occupant = self.grid.move(world.cell, world.occupant, won.agent, won.target)

The rule (`grant`): the claimants are put in a seeded random order — by `select.uniform(seed,
round, agent, CLAIM_SALT)`, the smallest first, agent id on a tie — and, in that order, each
takes the first target of its list (best first) that nobody before it took. An agent whose
targets were all taken gets nothing this round (`Granted.lost`): it stays as it was, sees so in
the next round's world, and may claim again. This is serial dictatorship (what sequential
activation in a shuffled order, Mesa's `shuffle_do`, gives), computed in parallel by deferred
acceptance with one common priority, which yields the same assignment: vectorised, a few numpy
passes (at most the longest list's length) over the claims still open.

`holder` (one value per target: the agent holding it, -1 if nobody) makes held targets
exclusive to their holder: another agent's claim on a held target is dropped, and a holder that
claims its own target keeps it (an agent listing its own cell among its choices stays when
nothing better is free). A target freed this round (its holder moved) is free from the next round on.

A claim naming a target outside 0..size-1 (or not a whole number) is the simulation's bug:
`ClaimError`, naming the round, the agent and the target; the run pauses (fix, then resume)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic_core import core_schema

from populace.sdk.select import uniform

CLAIM_SALT = 0x636C61696D  # "claim": the claimants' order, apart from activation's draws
NONE = -1  # in a claim list: no target (as populace.sdk.space.EMPTY)


class ClaimError(ValueError):
    """A claim the round cannot grant (its message names the agent, the target and why)."""


def _ints(values: Any, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all() or not np.array_equal(arr, np.floor(arr)):
            bad = arr.reshape(-1)[~(np.isfinite(arr.reshape(-1)) & (arr.reshape(-1) == np.floor(arr.reshape(-1))))][0]
            raise ClaimError(f"{what} {bad!r}: a target is a whole number")
    elif arr.dtype.kind not in "iu":
        raise ClaimError(f"{what}: targets are whole numbers, not {arr.dtype} values")
    return arr.astype(np.int64).reshape(-1)


class Claims:
    """What agents claim in a round: per claim its agent, its target and its rank in that agent's
    list (0: the agent's first choice). A partial's column (JSON on the wire; a large partial
    travels by reference); `merge` concatenates in any order: `grant` sorts."""

    __slots__ = ("agent", "rank", "target")

    def __init__(self, agent: Any = (), target: Any = (), rank: Any = None) -> None:
        self.agent = np.asarray(agent, dtype=np.int64).reshape(-1)
        self.target = np.asarray(target, dtype=np.int64).reshape(-1)
        self.rank = np.zeros(self.agent.size, dtype=np.int64) if rank is None \
            else np.asarray(rank, dtype=np.int64).reshape(-1)
        if not self.agent.size == self.target.size == self.rank.size:
            raise ClaimError(f"claims: {self.agent.size} agents, {self.target.size} targets and {self.rank.size} "
                             "ranks: one of each per claim")

    # -- building them (in reduce) ------------------------------------------------------------
    @classmethod
    def of(cls, agent_ids: Sequence[int] | np.ndarray, targets: Sequence[int | None] | np.ndarray) -> Claims:
        """One target per agent (None or -1: the agent claims nothing)."""
        ids = np.asarray(agent_ids, dtype=np.int64).reshape(-1)
        if isinstance(targets, np.ndarray):
            t = _ints(targets, "claims")
        else:
            t = np.fromiter((NONE if v is None else _whole(v, a) for a, v in zip(ids.tolist(), targets)),
                            dtype=np.int64, count=len(targets))
        if t.size != ids.size:
            raise ClaimError(f"claims: {ids.size} agents but {t.size} targets")
        keep = t != NONE
        return cls(ids[keep], t[keep])

    @classmethod
    def ranked(cls, agent_ids: Sequence[int] | np.ndarray, choices: Sequence[Sequence[int] | None] | np.ndarray
               ) -> Claims:
        """Each agent's targets in its order of preference (best first): a list per agent (None or
        empty: nothing), or a 2-D array with -1 where a row's list ends."""
        ids = np.asarray(agent_ids, dtype=np.int64).reshape(-1)
        if isinstance(choices, np.ndarray) and choices.ndim == 2:
            t = _ints(choices, "claims").reshape(choices.shape)
            if t.shape[0] != ids.size:
                raise ClaimError(f"claims: {ids.size} agents but {t.shape[0]} rows of choices")
            keep = t != NONE
            rank = np.cumsum(keep, axis=1) - 1
            return cls(np.broadcast_to(ids[:, None], t.shape)[keep], t[keep], rank[keep])
        agents: list[int] = []
        targets: list[int] = []
        ranks: list[int] = []
        if len(choices) != ids.size:
            raise ClaimError(f"claims: {ids.size} agents but {len(choices)} lists of choices")
        for a, row in zip(ids.tolist(), choices):
            if row is None:
                continue
            r = 0
            for v in row:
                if v is None or v == NONE:
                    continue
                agents.append(a)
                targets.append(_whole(v, a))
                ranks.append(r)
                r += 1
        return cls(agents, targets, ranks)

    @classmethod
    def merge(cls, parts: Iterable[Claims]) -> Claims:
        parts = [p for p in parts if p is not None]
        if not parts:
            return cls()
        return cls(np.concatenate([p.agent for p in parts]), np.concatenate([p.target for p in parts]),
                   np.concatenate([p.rank for p in parts]))

    def __len__(self) -> int:
        return int(self.agent.size)

    def __repr__(self) -> str:
        return f"Claims({self.agent.size} claims by {np.unique(self.agent).size} agents)"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Claims):
            return NotImplemented
        a, b = self.sorted(), other.sorted()
        return all(np.array_equal(x, y) for x, y in ((a.agent, b.agent), (a.target, b.target), (a.rank, b.rank)))

    def sorted(self) -> Claims:
        """The same claims by agent, then rank (whatever order the partials were merged in; the
        target breaks a tie of both, which only claims given twice have)."""
        agent, rank = self.agent, self.rank
        if agent.size == 0:
            return self
        width = int(rank.max()) + 1 if rank.size else 1
        order = np.argsort(agent * width + rank, kind="stable")
        key = agent[order] * width + rank[order]
        if (key[1:] == key[:-1]).any():
            order = np.lexsort((self.target, rank, agent))
        return Claims(agent[order], self.target[order], rank[order])

    # -- granting them (in decide) ------------------------------------------------------------
    def grant(self, size: int, *, seed: int, round: int, holder: np.ndarray | None = None, what: str = "target",
              salt: int = 0) -> Granted:
        """Each of targets 0..size-1 to one claimant (see the module's docstring). `what` names a
        target in errors ("cell"); `salt`: another order for a second kind of claim in one round."""
        return grant(self, size, seed=seed, round=round, holder=holder, what=what, salt=salt)

    # -- pydantic: a Partial's field ----------------------------------------------------------
    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls._validate, serialization=core_schema.plain_serializer_function_ser_schema(cls._dump, when_used="json"))

    @classmethod
    def _validate(cls, value: Any) -> Claims:
        if isinstance(value, Claims):
            return value
        if isinstance(value, dict) and set(value) <= {"agent", "target", "rank"} and {"agent", "target"} <= set(value):
            return cls(_ints(value["agent"], "claims.agent"), _ints(value["target"], "claims.target"),
                       None if value.get("rank") is None else _ints(value["rank"], "claims.rank"))
        raise ValueError("claims: a Claims, or {'agent': [...], 'target': [...], 'rank': [...]}")

    @staticmethod
    def _dump(value: Claims) -> dict:
        out: dict[str, list] = {"agent": value.agent.tolist(), "target": value.target.tolist()}
        if value.rank.any():
            out["rank"] = value.rank.tolist()
        return out


def _whole(v: Any, agent: int) -> int:
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return int(v)
    raise ClaimError(f"agent {agent} claims {v!r}: a target is a whole number")


@dataclass(frozen=True, eq=False)
class Granted:
    """What a round's claims gave: `agent[i]` got `target[i]` (by agent id, ascending); `lost`:
    the agents that claimed and got nothing (ascending)."""

    agent: np.ndarray
    target: np.ndarray
    lost: np.ndarray

    def __len__(self) -> int:
        return int(self.agent.size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Granted):
            return NotImplemented
        return all(np.array_equal(a, b) for a, b in ((self.agent, other.agent), (self.target, other.target),
                                                      (self.lost, other.lost)))

    def per_agent(self, agents: int) -> np.ndarray:
        """One value per agent of the run: the target it got, -1 if none."""
        out = np.full(agents, NONE, dtype=np.int64)
        out[self.agent] = self.target
        return out


def grant(claims: Claims, size: int, *, seed: int, round: int, holder: np.ndarray | None = None,
          what: str = "target", salt: int = 0) -> Granted:
    """Each of targets 0..size-1 to at most one claimant: serial dictatorship in a seeded order
    (see the module's docstring). Pure: the same claims in any order give the same grant."""
    c = claims.sorted()
    agent, target = c.agent, c.target
    bad = (target < 0) | (target >= size)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])  # the smallest agent id with a bad claim: the same on every placement
        raise ClaimError(f"agent {int(agent[i])} claims {what} {int(target[i])}, which does not exist "
                         f"({what}s are 0..{size - 1})" if size else
                         f"agent {int(agent[i])} claims {what} {int(target[i])}, but there are no {what}s")
    everyone = _distinct(agent)
    if holder is not None:
        holder = np.asarray(holder)
        if holder.shape != (size,):
            raise ClaimError(f"holder: one value per {what} ({size}), not an array of shape {holder.shape}")
        held = holder[target]
        keep = (held == NONE) | (held == agent)
        agent, target = agent[keep], target[keep]
    empty = np.zeros(0, dtype=np.int64)
    if agent.size == 0:
        return Granted(empty, empty, everyone)
    starts = np.flatnonzero(np.r_[True, agent[1:] != agent[:-1]])  # each claimant's claims, best first
    claimants = agent[starts]
    ends = np.r_[starts[1:], agent.size]
    n = claimants.size
    # the order agents choose in: a seeded draw per (round, agent), the agent id on a tie (a stable
    # sort of ascending ids); priority[i]: claimant i's place in it
    by_draw = np.argsort(uniform(seed, round, claimants, CLAIM_SALT + salt), kind="stable")
    priority = np.empty(n, dtype=np.int64)
    priority[by_draw] = np.arange(n)
    slot, slots = _slots(target, size, n)
    held_by = np.full(slots, NONE, dtype=np.int64)  # the priority of the claimant holding each target, so far
    cursor = starts.copy()  # each claimant's current claim (an index into the sorted claims)
    active = np.arange(n)
    # Deferred acceptance with one priority: the open claimants propose their next target; each
    # target keeps the proposer (or its holder so far) first in the order; the rest go on to their
    # next. One sort a pass, of (target, priority) in one int64 key.
    while active.size:
        t = slot[cursor[active]]
        holders = held_by[t]
        had = holders != NONE
        key = np.sort(np.concatenate([t * n + priority[active], t[had] * n + holders[had]]))
        key = key[np.r_[True, key[1:] != key[:-1]]]  # a holder competes once, however many proposed to it
        cand_t, cand_p = key // n, key % n
        first = np.r_[True, cand_t[1:] != cand_t[:-1]]
        held_by[cand_t[first]] = cand_p[first]
        losers = by_draw[cand_p[~first]]
        cursor[losers] += 1
        active = losers[cursor[losers] < ends[losers]]
    got = np.flatnonzero(held_by != NONE)
    winners = by_draw[held_by[got]]
    won_target = got if slots == size else _targets(target, slot, got)
    by_agent = np.argsort(winners)
    won_agent = claimants[winners[by_agent]]
    return Granted(won_agent, won_target[by_agent], np.setdiff1d(everyone, won_agent, assume_unique=True))


def _distinct(sorted_ids: np.ndarray) -> np.ndarray:
    return sorted_ids[np.r_[True, sorted_ids[1:] != sorted_ids[:-1]]] if sorted_ids.size else sorted_ids


# Targets are indexed directly up to this many (one int64 each); beyond, only the claimed ones.
DIRECT_TARGETS = 1 << 24


def _slots(target: np.ndarray, size: int, n: int) -> tuple[np.ndarray, int]:
    """Each claim's target as an index into a table of targets, and the table's length: the
    target itself (a grid up to DIRECT_TARGETS cells), else its rank among the targets claimed."""
    if size <= DIRECT_TARGETS:
        return target, size
    order = np.argsort(target, kind="stable")
    ts = target[order]
    new = np.r_[True, ts[1:] != ts[:-1]]
    slot = np.empty(target.size, dtype=np.int64)
    slot[order] = np.cumsum(new) - 1
    return slot, int(new.sum())


def _targets(target: np.ndarray, slot: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """The targets of table entries `slots` (from _slots' compact table)."""
    table = np.empty(int(slot.max()) + 1, dtype=np.int64)
    table[slot] = target
    return table[slots]
