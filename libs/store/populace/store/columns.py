"""Checking an outcome batch's columns against the run's declared tables, in pydantic-core:
a batch whose columns are not exactly the declared ones, or whose outcome values do not fit
their types (NaN, infinities, out-of-range integers included), is refused whole.

A simulation with scenes sends each group whole in one batch: its members' outcomes with its
acts and lines. A group whose acts or lines do not belong (an act by an agent whose outcome is
not in the batch, or is in another group; a line of a group with no member here; an act value
that does not fit its column; more acts or lines than its members may have in a round) is
refused alone: its outcomes, acts and lines are taken out of the batch together, so none of
them is half-recorded, and the rest of the batch goes on. So is a group an agent of the batch
cannot be in by the run's group layout: a host writes only its own agents' groups."""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from populace.core.contracts import MAX_ACTS_PER_MEMBER, MAX_LINES_PER_MEMBER, OutcomeBatch, SimulationTables
from populace.core.ranges import not_in, outside
from populace.core.yamlload import short_repr

_INT64 = Annotated[int, Field(ge=-(2**63), lt=2**63)]
_STRICT_FLOATS = ConfigDict(allow_inf_nan=False)
ADAPTERS: dict[str, TypeAdapter] = {
    "DOUBLE": TypeAdapter(list[float | None], config=_STRICT_FLOATS),
    "BIGINT": TypeAdapter(list[_INT64 | None]),
    "VARCHAR": TypeAdapter(list[str | None]),
    "BOOLEAN": TypeAdapter(list[bool | None]),
    "JSON": TypeAdapter(list[Any]),
    # LIST columns (an outcome's `list[int]` …): a list per row, or NULL
    "DOUBLE[]": TypeAdapter(list[list[float] | None], config=_STRICT_FLOATS),
    "BIGINT[]": TypeAdapter(list[list[_INT64] | None]),
    "VARCHAR[]": TypeAdapter(list[list[str] | None]),
    "BOOLEAN[]": TypeAdapter(list[list[bool] | None]),
}
_IDS = TypeAdapter(list[_INT64])
_LATENCY = TypeAdapter(list[float], config=_STRICT_FLOATS)


class BadColumns(ValueError):
    pass


@dataclass(frozen=True)
class RefusedGroup:
    """A group taken out of a batch: its members' outcomes, acts and lines are not recorded."""

    group_id: int
    agents: list[int]  # its members whose outcomes the batch carried
    acts: int
    lines: int
    reason: str


def check_outcomes(batch: OutcomeBatch, tables: SimulationTables) -> tuple[OutcomeBatch, list[RefusedGroup]]:
    """The batch with its columns validated (and coerced) by their declared types, without the
    groups refused (returned apart, with why). Raises BadColumns to refuse the whole batch."""
    declared = {c.name: c.type for c in tables.outcome_columns}
    if set(batch.columns) != set(declared):
        raise BadColumns(f"columns {sorted(batch.columns)} are not the run's outcome columns {sorted(declared)}")
    if tables.grouped != (batch.group_ids is not None):
        raise BadColumns("group_ids must be given exactly when the simulation has groups")
    if sorted(batch.levels or {}) != sorted(tables.levels):
        raise BadColumns(f"levels {sorted(batch.levels or {})} are not the run's outer group levels {tables.levels}")
    if (batch.acts is not None or batch.lines is not None) and (tables.acts is None or batch.group_ids is None):
        raise BadColumns("acts and lines belong to a simulation with scenes")
    if batch.acts is not None:
        declared_acts = {c.name: c.type for c in tables.act_columns}
        if set(batch.acts.columns) != set(declared_acts):
            raise BadColumns(f"act columns {sorted(batch.acts.columns)} are not the run's {sorted(declared_acts)}")
    members = set(batch.agent_ids)
    if batch.edits is not None:
        if not tables.edge_kinds:
            raise BadColumns("edits belong to a simulation with edge kinds")
        strangers = set(batch.edits.follower) - members
        if strangers:  # an agent edits its own in-edges only, in the batch of its own outcome
            raise BadColumns(f"edits.follower: agent {min(strangers)} has no outcome in this batch")
        unknown = set(batch.edits.kind) - set(tables.edge_kinds)
        if unknown:
            raise BadColumns(f"edits.kind: {min(unknown)!r} is not one of the run's edge kinds {tables.edge_kinds}")
    if batch.shown is not None:
        if tables.shown_items is None:
            raise BadColumns("shown belongs to a simulation that declares shown_items")
        strangers = set(batch.shown.agent_id) - members
        if strangers:  # an agent's record rides with its own outcome
            raise BadColumns(f"shown.agent_id: agent {min(strangers)} has no outcome in this batch")
        if len(set(batch.shown.agent_id)) != len(batch.shown.agent_id):
            raise BadColumns("shown.agent_id: an agent has two records in one round")
    refused: list[RefusedGroup] = []
    if bad_by_group := bad_groups(batch, tables):
        refused = refused_groups(batch, bad_by_group)
        batch = without_groups(batch, set(bad_by_group))
    columns = {}
    checks = [(f"columns.{name}", ADAPTERS[declared[name]], values) for name, values in batch.columns.items()]
    checks += [("agent_ids", _IDS, batch.agent_ids), ("latency_ms", _LATENCY, batch.latency_ms)]
    if batch.group_ids is not None:
        checks.append(("group_ids", _IDS, batch.group_ids))
    for where, adapter, values in checks:
        try:
            checked = adapter.validate_python(values)
        except ValidationError as err:
            first = err.errors()[0]
            raise BadColumns(f"{where}[{first['loc'][0] if first['loc'] else ''}]: {first['msg']} "
                             f"(got {short_repr(first.get('input'))})") from None
        if where.startswith("columns."):
            columns[where.removeprefix("columns.")] = checked
    if tables.measure_range is not None and tables.measure in columns:
        bad = outside(columns[tables.measure], batch.valid, tables.measure_range)
        if bad:
            lo, hi = tables.measure_range
            raise BadColumns(f"columns.{tables.measure}[{bad[0]}]: {columns[tables.measure][bad[0]]!r} is outside "
                             f"the run's declared range [{lo:g}, {hi:g}]")
    if tables.measure_options and tables.measure in columns:
        bad = not_in(columns[tables.measure], batch.valid, frozenset(tables.measure_options))
        if bad:
            raise BadColumns(f"columns.{tables.measure}[{bad[0]}]: {columns[tables.measure][bad[0]]!r} is not one "
                             "of the run's declared options")
    return batch.model_copy(update={"columns": columns}), refused


def misgrouped(batch: OutcomeBatch, tables: SimulationTables) -> dict[int, str]:
    """The groups the batch's agents claim but cannot be in by the run's group layout (its
    `group_sizes` and `group_block`; none declared: nothing checked), each with why: fixed
    groups of k consecutive ids (agent a is in group a // k, and in a // size at each outer
    level), or groups drawn again each round within blocks (agent a is in one of its block's)."""
    if not tables.group_sizes or batch.group_ids is None or not batch.agent_ids:
        return {}
    ids = np.asarray(batch.agent_ids, dtype=np.int64)
    gids = np.asarray(batch.group_ids, dtype=np.int64)
    k, block = tables.group_sizes[0], tables.group_block
    wrong = gids // (block // k) != ids // block if block else gids != ids // k
    outer = list(zip(tables.levels, tables.group_sizes[1:])) if len(tables.levels) == len(tables.group_sizes) - 1 \
        else []
    for level, size in outer:
        wrong |= np.asarray((batch.levels or {}).get(level, ()), dtype=np.int64) != ids // size
    bad: dict[int, str] = {}
    for i in np.flatnonzero(wrong).tolist():
        a, g = int(ids[i]), int(gids[i])
        if g in bad:
            continue
        if block:
            first = a // block * (block // k)
            bad[g] = (f"group_ids: agent {a} cannot be in group {g} (groups are drawn within blocks of {block} "
                      f"agents: its block's are {first}..{first + block // k - 1})")
        elif g != a // k:
            bad[g] = f"group_ids: agent {a} cannot be in group {g} (groups of {k} consecutive ids: its is {a // k})"
        else:
            level, size = next((lv, sz) for lv, sz in outer if batch.levels[lv][i] != a // sz)
            bad[g] = f"levels.{level}: agent {a} cannot be in {level} {batch.levels[level][i]} (its is {a // size})"
    return bad


def bad_groups(batch: OutcomeBatch, tables: SimulationTables) -> dict[int, str]:
    """The groups of the batch that cannot be recorded, each with why (the first reason found):
    a group one of its agents cannot be in (misgrouped); every act's agent must have its outcome
    in the batch, in the act's group; every line's speaker too (the scene itself, -1, speaks in a
    group with a member here); an act's values must fit their columns; a group of k members here
    acts at most MAX_ACTS_PER_MEMBER × k times and says at most MAX_LINES_PER_MEMBER × k lines
    (each member's outcome is recorded once a round, so that bounds its group's round). A batch
    without agents carries none."""
    bad = misgrouped(batch, tables)
    if batch.acts is None and batch.lines is None:
        return bad
    group_of = dict(zip(batch.agent_ids, batch.group_ids or ()))
    present = set(group_of.values())

    def belongs(group: int, agent: int, where: str) -> None:
        if group in bad:
            return
        if agent == -1 and where == "lines.speaker":
            if group not in present:
                bad[group] = f"lines.group_id: group {group} has no member in this batch"
        elif agent not in group_of:
            bad[group] = f"{where}: agent {agent} has no outcome in this batch"
        elif group_of[agent] != group:
            bad[group] = f"{where}: agent {agent} is in group {group_of[agent]}, not group {group}"

    if (a := batch.acts) is not None:
        # the common case at C speed (every act's agent here, in the act's group); else act by act
        if not all(map(operator.eq, map(group_of.get, a.agent_id), a.group_id)):
            for group, agent in zip(a.group_id, a.agent_id):
                belongs(group, agent, "acts.agent_id")
        declared = {c.name: c.type for c in tables.act_columns}
        for name, values in a.columns.items():
            try:
                ADAPTERS[declared[name]].validate_python(values)
            except ValidationError as err:
                for e in err.errors():
                    i = e["loc"][0] if e["loc"] and isinstance(e["loc"][0], int) else None
                    if i is None:  # not one value: the column itself (not a list)
                        raise BadColumns(f"acts.columns.{name}: {e['msg']}") from None
                    bad.setdefault(a.group_id[i], f"acts.columns.{name}[{i}]: {e['msg']} "
                                                  f"(got {short_repr(e.get('input'))})")
    if (x := batch.lines) is not None:
        for group, speaker in zip(x.group_id, x.speaker):
            belongs(group, speaker, "lines.speaker")
    members = Counter(batch.group_ids or [])
    for what, rows, most in (("acts", a.group_id if a is not None else [], MAX_ACTS_PER_MEMBER),
                             ("lines", x.group_id if x is not None else [], MAX_LINES_PER_MEMBER)):
        for group, n in Counter(rows).items():
            if group not in bad and n > most * members.get(group, 0):
                bad[group] = (f"{what}.group_id: group {group} has {n:,} {what} in round {batch.round}, more than "
                              f"{most} per member ({members.get(group, 0)} here)")
    return bad


def refused_groups(batch: OutcomeBatch, bad: dict[int, str]) -> list[RefusedGroup]:
    """What refusing `bad` (group -> why) takes out of the batch, group by group, in group order."""
    agents: dict[int, list[int]] = {g: [] for g in bad}
    for agent, group in zip(batch.agent_ids, batch.group_ids or ()):
        if group in agents:
            agents[group].append(agent)
    acts = _count(batch.acts.group_id if batch.acts is not None else [], bad)
    lines = _count(batch.lines.group_id if batch.lines is not None else [], bad)
    return [RefusedGroup(g, agents[g], acts.get(g, 0), lines.get(g, 0), bad[g]) for g in sorted(bad)]


def _count(groups: list[int], of: dict[int, str]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for g in groups:
        if g in of:
            counts[g] = counts.get(g, 0) + 1
    return counts


def without_groups(batch: OutcomeBatch, groups: set[int]) -> OutcomeBatch:
    """The batch with every row of `groups` taken out: their members' outcomes (and what rides
    with an outcome: its post, its levels, its edge edits), their acts and their lines."""
    return batch.take([i for i, g in enumerate(batch.group_ids or ()) if g not in groups])
