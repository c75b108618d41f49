"""Checking an outcome batch's columns against the run's declared tables, in pydantic-core:
a batch whose columns are not exactly the declared ones, or whose values do not fit their
types (NaN, infinities, out-of-range integers included), is refused whole."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from populace.core.contracts import OutcomeBatch, SimulationTables
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
}
_IDS = TypeAdapter(list[_INT64])
_LATENCY = TypeAdapter(list[float], config=_STRICT_FLOATS)


class BadColumns(ValueError):
    pass


def check_outcomes(batch: OutcomeBatch, tables: SimulationTables) -> OutcomeBatch:
    """The batch with its columns validated (and coerced) by their declared types."""
    declared = {c.name: c.type for c in tables.outcome_columns}
    if set(batch.columns) != set(declared):
        raise BadColumns(f"columns {sorted(batch.columns)} are not the run's outcome columns {sorted(declared)}")
    if tables.grouped != (batch.group_ids is not None):
        raise BadColumns("group_ids must be given exactly when the simulation has groups")
    if sorted(batch.levels or {}) != sorted(tables.levels):
        raise BadColumns(f"levels {sorted(batch.levels or {})} are not the run's outer group levels {tables.levels}")
    if (batch.acts is not None or batch.lines is not None) and tables.acts is None:
        raise BadColumns("acts and lines belong to a simulation with scenes")
    members = set(batch.agent_ids)
    if batch.acts is not None:
        declared_acts = {c.name: c.type for c in tables.act_columns}
        if set(batch.acts.columns) != set(declared_acts):
            raise BadColumns(f"act columns {sorted(batch.acts.columns)} are not the run's {sorted(declared_acts)}")
        strangers = set(batch.acts.agent_id) - members
        if strangers:  # an act is recorded with its member's outcome, never for another agent
            raise BadColumns(f"acts.agent_id: agent {min(strangers)} has no outcome in this batch")
        for name, values in batch.acts.columns.items():
            try:
                ADAPTERS[declared_acts[name]].validate_python(values)
            except ValidationError as err:
                first = err.errors()[0]
                raise BadColumns(f"acts.columns.{name}[{first['loc'][0] if first['loc'] else ''}]: "
                                 f"{first['msg']}") from None
    if batch.edits is not None:
        if not tables.edge_kinds:
            raise BadColumns("edits belong to a simulation with edge kinds")
        strangers = set(batch.edits.follower) - members
        if strangers:  # an agent edits its own in-edges only, in the batch of its own outcome
            raise BadColumns(f"edits.follower: agent {min(strangers)} has no outcome in this batch")
        unknown = set(batch.edits.kind) - set(tables.edge_kinds)
        if unknown:
            raise BadColumns(f"edits.kind: {min(unknown)!r} is not one of the run's edge kinds {tables.edge_kinds}")
    if batch.lines is not None:
        strangers = set(batch.lines.speaker) - members - {-1}
        if strangers:
            raise BadColumns(f"lines.speaker: agent {min(strangers)} has no outcome in this batch")
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
    return batch.model_copy(update={"columns": columns})
