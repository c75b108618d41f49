"""What an agent's turn returns: one outcome, recorded as one row per agent per round.

An outcome class declares the simulation's columns as annotated fields with defaults:

    class Guess(Outcome):
        value: float | None = None

Every subclass becomes a keyword-only dataclass: a plain object, not a pydantic model,
because a host creates one per agent per round (a million per round at the benchmark's
scale) and validates them per batch of ~1,000 instead (`columns_adapter`).

`valid` and `raw` belong to every outcome: whether the agent's answer counts, and the
model's text, kept even when it does not; `post` too, what the agent says to the agents that
hear it in a run with a graph (see `populace.sdk.post`). The defaults of an outcome are what an agent whose
turn failed records, so every field needs one.

Column types: `float`, `int`, `str`, `bool`, a `Literal[...]` of texts or of whole numbers, a
list of one of the four (`list[int]` is a DuckDB `BIGINT[]`, `list[float]` `DOUBLE[]`,
`list[str]` `VARCHAR[]`, `list[bool]` `BOOLEAN[]`; `Ids` is `list[int]` of ids: each >= 0, at
most MAX_IDS of them), and any other `dict` or `list` as JSON; each optionally `| None`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Annotated, Any, ClassVar, Literal, Union, dataclass_transform

from pydantic import ConfigDict, Field, TypeAdapter

# Columns the platform writes itself: a simulation may not declare these.
PLATFORM_OUTCOME_COLUMNS = ("run_id", "round", "agent_id", "group_id", "valid", "raw", "latency_ms", "error")
_COLUMN_TYPES = {float: "DOUBLE", int: "BIGINT", str: "VARCHAR", bool: "BOOLEAN", dict: "JSON", list: "JSON"}
# a list of one scalar type is a DuckDB LIST column (queried with unnest, list_contains, len …)
_LIST_TYPES = {int: "BIGINT[]", float: "DOUBLE[]", str: "VARCHAR[]", bool: "BOOLEAN[]"}
# The most ids one value of an `Ids` field holds: a row travels in a batch of ~1,000 rows, in one
# message under NATS' 1 MB (10,000 ids are ~100 KB as JSON).
MAX_IDS = 10_000
# An id-list field: the items an agent saw, the agents it named … (`list[int]` of ids >= 0)
Ids = Annotated[list[Annotated[int, Field(ge=0, lt=2**63)]], Field(max_length=MAX_IDS)]


@dataclass_transform(kw_only_default=True)
class Outcome:
    """Base of every simulation's outcome (see the module docstring)."""

    valid: bool = True
    raw: str = ""
    # what the agent says to those who hear it (a run with a `graph:`): the simulation's Post
    post: Any = None
    # edge edits (a simulation with `edge_kinds`): [follow(author), unfollow(author), …]
    edits: Any = None
    measure: ClassVar[str | None] = None  # the column analysis summarises first (default: the first)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(kw_only=True)(cls)


Outcome = dataclasses.dataclass(kw_only=True)(Outcome)  # type: ignore[misc]


class OutcomeError(TypeError):
    """An outcome class that cannot be recorded (a field without a default, an unsupported type)."""


def _bare(annotation: Any) -> Any:
    """The type inside `Annotated[type, ...]` (constraints are the validator's, not the column's)."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _base_type(annotation: Any) -> tuple[Any, bool]:
    """(the non-None type, nullable) of an annotation such as `float | None`."""
    annotation = _bare(annotation)
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _bare(args[0]), True
        return annotation, True
    return annotation, False


def literal_values(annotation: Any) -> tuple | None:
    """The values of a `Literal[...]` annotation (also `Literal[...] | None`), else None."""
    base, _ = _base_type(annotation)
    return typing.get_args(base) if typing.get_origin(base) is Literal else None


def column_type(annotation: Any) -> str:
    """The DuckDB column type of an outcome or summary field's annotation."""
    base, _ = _base_type(annotation)
    if typing.get_origin(base) is Literal:
        values = typing.get_args(base)
        if all(isinstance(v, str) for v in values):
            return "VARCHAR"
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return "BIGINT"
        raise OutcomeError(f"Literal{list(values)}: only all-string or all-integer literals are columns")
    if typing.get_origin(base) is list:
        items = typing.get_args(base)
        return _LIST_TYPES.get(_bare(items[0]), "JSON") if len(items) == 1 else "JSON"
    if typing.get_origin(base) is dict:
        return "JSON"
    if base in _COLUMN_TYPES:
        return _COLUMN_TYPES[base]
    raise OutcomeError(f"{annotation!r} is not a column type (use float, int, str, bool, a Literal, "
                       "a list of one of them, dict or list, optionally `| None`)")


def outcome_fields(cls: type[Outcome]) -> list[tuple[str, Any]]:
    """The simulation's own columns of an outcome class: (name, annotation), in order."""
    hints = typing.get_type_hints(cls, include_extras=True)  # an `Ids` field keeps its constraints
    out = []
    for f in dataclasses.fields(cls):
        if f.name in ("valid", "raw", "post", "edits"):
            continue
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise OutcomeError(f"{cls.__name__}.{f.name} needs a default: it is what an agent whose "
                               "turn failed records")
        if f.name in PLATFORM_OUTCOME_COLUMNS:
            raise OutcomeError(f"{cls.__name__}.{f.name}: the platform records that column itself")
        out.append((f.name, hints[f.name]))
    return out


def columns_adapter(cls: type[Outcome]) -> dict[str, TypeAdapter]:
    """One validator per column (a list of values), run by pydantic-core per batch."""
    config = ConfigDict(allow_inf_nan=False)
    return {name: TypeAdapter(list[annotation], config=config)  # type: ignore[valid-type]
            for name, annotation in outcome_fields(cls)}
