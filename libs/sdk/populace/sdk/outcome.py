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
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, ClassVar, Literal, Union, dataclass_transform

from pydantic import ConfigDict, TypeAdapter

# Columns the platform writes itself: a simulation may not declare these.
PLATFORM_OUTCOME_COLUMNS = ("run_id", "round", "agent_id", "group_id", "valid", "raw", "latency_ms", "error")
_COLUMN_TYPES = {float: "DOUBLE", int: "BIGINT", str: "VARCHAR", bool: "BOOLEAN", dict: "JSON", list: "JSON"}


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


def _base_type(annotation: Any) -> tuple[Any, bool]:
    """(the non-None type, nullable) of an annotation such as `float | None`."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
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
    if typing.get_origin(base) in (dict, list):
        return "JSON"
    if base in _COLUMN_TYPES:
        return _COLUMN_TYPES[base]
    raise OutcomeError(f"{annotation!r} is not a column type (use float, int, str, bool, a Literal, "
                       "dict or list, optionally `| None`)")


def outcome_fields(cls: type[Outcome]) -> list[tuple[str, Any]]:
    """The simulation's own columns of an outcome class: (name, annotation), in order."""
    hints = typing.get_type_hints(cls)
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
