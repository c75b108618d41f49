"""Who saw what. A view records what it shows an agent in one call, and the platform keeps one row
per acting agent per round in table `shown`:

    class FeedEnv(Env):
        World = Pool
        shown_items = "post_id"          # the world column whose values a view shows

        def view(self, world, round, agent_id):
            feed = ...                       # the posts it reads, best first
            self.show(agent_id, feed.post_ids)          # ranks: 1, 2, … (or ranks=[…])
            return feed

Table `shown`: run_id, round, agent_id, items (BIGINT[], in the order shown), ranks (INTEGER[],
the recommender's rank of each item, 1 = its best; by default the order shown). A record rides
in the outcome batch of its agent, so it is recorded exactly when the agent's outcome is, and a
replayed round (a re-placed host, a resume) replaces it.

Each item must be a value of the declared world column in the round's world: an item that is
not, an item shown twice, or ranks that do not match the items is the simulation's bug: the
round stops and the run pauses, naming the field, the round and the agent. The check is
vectorised per batch of outcomes (one sorted look-up of every item of ~1,000 agents)."""

from __future__ import annotations

import itertools
import operator
from typing import Any

import numpy as np

from populace.core.contracts.run_events import MAX_SHOWN  # the most items one record holds


class ShownError(ValueError):
    """A record of what an agent was shown that cannot be recorded (the simulation's bug)."""


def checked(items: Any, ranks: Any = None) -> tuple[list[int], list[int]]:
    """(items, ranks) as lists of whole numbers, or ShownError naming what is wrong. Ranks
    default to the order shown (1, 2, …)."""
    values = _whole("shown.items", items)
    if len(values) > MAX_SHOWN:
        raise ShownError(f"shown.items: {len(values):,} items, more than a record holds ({MAX_SHOWN:,})")
    if len(set(values)) != len(values):
        seen: set[int] = set()
        for v in values:
            if v in seen:
                raise ShownError(f"shown.items: item {v} is shown twice")
            seen.add(v)
    if ranks is None:
        return values, list(range(1, len(values) + 1))
    order = _whole("shown.ranks", ranks)
    if len(order) != len(values):
        raise ShownError(f"shown.ranks: {len(order)} ranks for {len(values)} items (one rank per item)")
    if order and min(order) < 1:
        raise ShownError(f"shown.ranks: rank {min(order)} (ranks count from 1, the best)")
    return values, order


def _whole(where: str, values: Any) -> list[int]:
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or (values.size and values.dtype.kind not in "iu"):
            raise ShownError(f"{where}: a 1-D array of whole numbers, not {values.dtype} of shape {values.shape}")
        return values.tolist()
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ShownError(f"{where}: a list of ids, not {type(values).__name__}")
    out = list(values)
    for i, v in enumerate(out):
        if type(v) is not int:  # the common case costs one check per item
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ShownError(f"{where}[{i}]: {v!r} is not a whole number")
            out[i] = int(v)
    return out


class ShownBook:
    """One round's records on one host: kept from an agent's view until its outcome leaves in a
    batch (`take`), then checked against the round's world column and handed to the batch."""

    __slots__ = ("_known", "_records", "_values", "column", "round", "sim_name", "viewing")

    def __init__(self, sim_name: str, round_: int, column: str, values: np.ndarray) -> None:
        """`column`: the world column's name as messages give it (`Pool.post_id`), `values` its values."""
        self.sim_name, self.round, self.column = sim_name, round_, column
        self._values = values
        self._known: np.ndarray | None = None  # the column's distinct values, sorted (made once)
        self._records: dict[int, tuple[list[int], list[int]]] = {}
        self.viewing: int | None = None  # the agent whose view is being made

    def add(self, agent_id: int, items: Any, ranks: Any = None) -> None:
        if self.viewing is not None and agent_id != self.viewing:
            raise ShownError(f"show({agent_id}, …) in the view of agent {self.viewing}: a view records what "
                             "its own agent is shown")
        self._records[agent_id] = checked(items, ranks)  # a view made again replaces it

    def take(self, agent_ids: list[int]) -> dict[str, list] | None:
        """The records of these agents (the batch's order) as columns, removed from the book; None:
        none of them has one. ShownError naming the first agent shown an item the world lacks."""
        records = self._records
        if not records:
            return None
        pop = records.pop
        rows = [(aid, r) for aid in agent_ids if (r := pop(aid, None)) is not None]
        if not rows:
            return None
        items = [r[0] for _, r in rows]
        flat = np.fromiter(itertools.chain.from_iterable(items), dtype=np.int64,
                           count=sum(map(len, items)))
        if flat.size:
            known = self._known
            if known is None:
                known = self._known = np.unique(np.asarray(self._values, dtype=np.int64))
            at = np.minimum(np.searchsorted(known, flat), max(known.size - 1, 0))
            missing = (known[at] != flat) if known.size else np.ones(flat.size, dtype=bool)
            if missing.any():
                first = int(np.flatnonzero(missing)[0])
                ends = np.cumsum([len(i) for i in items])
                row = int(np.searchsorted(ends, first, side="right"))
                raise ShownError(f"simulation {self.sim_name!r}, round {self.round}, agent {rows[row][0]}: "
                                 f"shown.items: {int(flat[first])} is not in the round's {self.column}")
        return {"agent_id": list(map(operator.itemgetter(0), rows)), "items": items, "ranks": [r[1] for _, r in rows]}
