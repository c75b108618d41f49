"""Who is in which group in a round, pure: a simulation's groups of consecutive agent ids, nested
levels of them (teams within firms), or groups drawn again every round inside fixed blocks
(stranger matching). Blocks and the outermost level are placed whole on one host, so every
group — at every level — is settled (or plays its scene) where its members are.

Only the agents that act in a round are grouped: a fixed group's members are its selected
agents, and a block's selected agents are shuffled and cut into groups. The shuffle is seeded
by (run seed, round, block), so every placement draws the same groups."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from populace.sdk.rng import stable_seed


class GroupError(ValueError):
    """A group layout that cannot work (its message names what and why)."""


@dataclass(frozen=True, slots=True)
class Group:
    id: int  # its id at the innermost level (recorded as group_id)
    members: tuple[int, ...]  # agent ids, in the group's order (roles: first proposes …)
    outer: tuple[int, ...] = ()  # its ids at each outer level, inner to outer


@dataclass(frozen=True)
class GroupLayout:
    sizes: tuple[int, ...]  # agents per group at each level, innermost first (each divides the next)
    agents: int
    seed: int = 0
    block: int | None = None  # groups drawn again each round within blocks of this many agents

    def __post_init__(self) -> None:
        if not self.sizes or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in self.sizes):
            raise GroupError(f"group sizes {self.sizes!r}: whole numbers >= 1")
        for inner, outer in zip(self.sizes, self.sizes[1:]):
            if outer % inner:
                raise GroupError(f"group sizes {self.sizes!r}: {outer} is not a multiple of {inner} (each level "
                                 "holds whole groups of the level below)")
        if self.block is not None:
            if len(self.sizes) > 1:
                raise GroupError("groups drawn again each round (a block) have one level only")
            if self.block < 1 or self.block % self.sizes[0]:
                raise GroupError(f"block {self.block}: a multiple of the group size {self.sizes[0]}")

    @property
    def unit(self) -> int:
        """Agents that must stay on one host: a block, or a group of the outermost level."""
        return self.block or self.sizes[-1]

    @property
    def levels(self) -> int:
        return len(self.sizes)

    def groups(self, round_: int, selected: np.ndarray) -> list[Group]:
        """The round's innermost groups of the `selected` agent ids (int64, sorted; whole units
        only, as placement gives them), each with its ids at the outer levels."""
        if selected.size == 0:
            return []
        k = self.sizes[0]
        if self.block is None:
            gids = selected // k
            cuts = np.flatnonzero(np.diff(gids)) + 1
            out = []
            for members in np.split(selected, cuts):
                first = int(members[0])
                outer = tuple(first // size for size in self.sizes[1:])
                out.append(Group(first // k, tuple(members.tolist()), outer))
            return out
        per_block = self.block // k
        blocks = selected // self.block
        cuts = np.flatnonzero(np.diff(blocks)) + 1
        out = []
        for members in np.split(selected, cuts):
            b = int(members[0]) // self.block
            order = members.tolist()
            random.Random(stable_seed(self.seed, round_, b, "groups")).shuffle(order)
            for j in range(0, len(order), k):
                out.append(Group(b * per_block + j // k, tuple(order[j:j + k])))
        return out
