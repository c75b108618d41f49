"""State that comes back from JSON as it went in.

Everything a run keeps between rounds crosses JSON: an agent's declared state (its checkpoint,
written by its host, read by a resume, a fork, a re-placed host or an interview), the
environment's `State`, the round's `Observation` and a host's `Partial` (on the wire). JSON has
no tuple, set or deque and only text keys, so a package that kept `(3, 4)` got `[3, 4]` back
after the first round, and failed, or played on from different values.

A value JSON keeps as it is (numbers, text, booleans, None, and lists and text-keyed dicts of
them) is written as it is. Any other value a state field may hold — tuples, sets, frozensets,
deques (with their maxlen), dicts with other keys, Fractions, nested in each other and in lists
and dicts — is written *typed*, `{"$populace": [kind, …]}`, and read back as it was. Any other
type (a pydantic model, a numpy value, an Enum, a class of the simulation's) is refused with a
StateTypeError naming the field: a checkpoint never runs code to rebuild a value.

Only what needs it pays: a column of plain values costs one pass over its types (in C), a
field's typed values a walk in Python. An agent's `memory` keeps its older rule (its items' lists
come back as tuples: one level, as `remember` keeps them) unless an agent remembered something
deeper (`Agent.remember` notes it, cheaply), so the ratio game's million memories are never walked.

A pydantic model's fields typed precisely (`tuple[int, int]`, `set[str]`, `dict[int, float]`) are
rebuilt by pydantic; only its loose fields (`Any`, `list`, `dict[str, Any]` …) are walked here.
"""

from __future__ import annotations

import functools
import types
import typing
from collections import deque
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from pydantic import BaseModel

MARK = "$populace"  # the key of a typed value (a plain dict holding it is written typed itself)
PLAIN = frozenset({int, float, str, bool, type(None)})
# how many agents' memories a checkpoint looks into besides what `remember` noted (a spread over
# the column: a memory set directly rather than remembered)
MEMORY_SAMPLE = 64


class StateTypeError(TypeError):
    """A value a checkpoint (or the wire) cannot give back as it was; the message names the field."""


# -- one value ----------------------------------------------------------------------------------

def plain(value: object) -> bool:
    """Whether JSON gives `value` back as it is (a typed dict's MARK key aside)."""
    kind = type(value)
    if kind in PLAIN:
        return True
    if kind is list:
        return PLAIN.issuperset(map(type, value)) or all(map(plain, value))
    if kind is dict:
        return MARK not in value and all(type(k) is str for k in value) and all(map(plain, value.values()))
    return False


def typed(value: object) -> object:
    """`value` in the typed form: every container a [kind, items] list, scalars as they are."""
    kind = type(value)
    if kind in PLAIN:
        return value
    if kind is tuple:
        return ["tuple", [typed(v) for v in value]]
    if kind is list:
        return ["list", [typed(v) for v in value]]
    if kind is dict:
        return ["dict", [[typed(k), typed(v)] for k, v in value.items()]]
    if kind is set or kind is frozenset:
        items = [typed(v) for v in value]
        try:  # the same bytes for the same set, whatever order it was built in
            items.sort(key=repr)
        except TypeError:  # pragma: no cover - repr is always text
            pass
        return ["set" if kind is set else "frozenset", items]
    if kind is deque:
        return ["deque", value.maxlen, [typed(v) for v in value]]  # type: ignore[attr-defined]
    if kind is Fraction:
        return ["fraction", f"{value.numerator}/{value.denominator}"]  # type: ignore[attr-defined]
    raise StateTypeError(f"a {kind.__module__}.{kind.__qualname__} ({_short(value)}) cannot be kept: a state "
                         "field holds numbers, text, booleans, None, and lists, tuples, dicts, sets, frozensets, "
                         "deques and Fractions of them")


def untyped(form: object) -> object:
    """The value a typed form stands for."""
    if type(form) is not list:
        return form
    kind, *rest = form
    if kind == "tuple":
        return tuple(map(untyped, rest[0]))
    if kind == "list":
        return list(map(untyped, rest[0]))
    if kind == "dict":
        return {untyped(k): untyped(v) for k, v in rest[0]}
    if kind == "set":
        return set(map(untyped, rest[0]))
    if kind == "frozenset":
        return frozenset(map(untyped, rest[0]))
    if kind == "deque":
        return deque(map(untyped, rest[1]), maxlen=rest[0])
    if kind == "fraction":
        return Fraction(rest[0])
    raise StateTypeError(f"a typed value of kind {kind!r} is not one this SDK writes")


def encode(value: object) -> object:
    """`value` as JSON keeps it: as it is when plain, typed otherwise."""
    return value if plain(value) else {MARK: typed(value)}


def decode(value: object) -> object:
    """What `encode` wrote, as it was (StateTypeError for a typed form this SDK never writes)."""
    if type(value) is dict and MARK in value and len(value) == 1:
        try:
            return untyped(value[MARK])
        except StateTypeError:
            raise
        except Exception as err:  # a form no encoder wrote: a value that cannot be a key, a bad fraction …
            raise StateTypeError(f"a typed value that cannot be read: {type(err).__name__}: {err}") from None
    return value


# -- an agent's declared state, by columns (a checkpoint) -------------------------------------

def encode_column(name: str, values: list, agent_id: Callable[[int], int] | None = None,
                  owner: type | None = None, *, every: bool = False) -> list:
    """A checkpoint column of `name`'s values: the list itself when every value is plain (one pass
    over their types), else each value encoded. `agent_id` (the i-th value's agent) and `owner`
    (their class) name the one a value that cannot be kept belongs to. `every`: look into every
    memory, not a sample (agents in their own processes: what they remembered was not seen here)."""
    if name == "memory" and _memories_keep(values, owner, every):
        return values
    if PLAIN.issuperset(map(type, values)):
        return values
    out = []
    for i, v in enumerate(values):
        try:
            out.append(encode(v))
        except StateTypeError as err:
            who = f"agent {agent_id(i)}" if agent_id is not None else "an agent"
            where = f"{owner.__name__}.{name}" if owner is not None else name
            raise StateTypeError(f"{where}: {who}'s value: {err}") from None
    return out


def decode_state(state: dict[str, Any], owner: type | None = None) -> dict[str, Any]:
    """One agent's state as a checkpoint gave it back (JSON), each field as it was saved: typed
    values rebuilt; a plain memory's items as `remember` keeps them (tuples, one level). `owner`:
    the agent's class (a typed memory read back keeps its memories typed from then on)."""
    out = {}
    for name, value in state.items():
        if type(value) is dict and MARK in value:
            value = decode(value)
            if name == "memory" and owner is not None:
                DEEP_MEMORY.add(owner)
        elif name == "memory" and type(value) is list:
            value = tuple(tuple(v) if type(v) is list else v for v in value)
        out[name] = value
    return out


# The agent classes whose memories hold an item the memory rule would not give back (not plain,
# nor a tuple of plain values): `Agent.remember` adds a class once it remembers one, a checkpoint
# once it finds one. Their memory columns are encoded value by value from then on.
DEEP_MEMORY: set[type] = set()


def memory_item_keeps(item: object) -> bool:
    """Whether the memory rule gives `item` back (a plain value, or a tuple of plain values)."""
    kind = type(item)
    return kind in PLAIN or (kind is tuple and PLAIN.issuperset(map(type, item)))  # type: ignore[arg-type]


def _memories_keep(values: list, owner: type | None, every: bool = False) -> bool:
    """Whether the memory rule gives back every memory in `values`: unless `remember` saw an item
    too deep, or a spread sample of memories holds one (a memory set directly, not remembered; a
    local run's state check looks at every field of its sample too)."""
    if owner is None or owner in DEEP_MEMORY:
        return False
    step = 1 if every else max(1, len(values) // MEMORY_SAMPLE)
    if all(type(m) is tuple and all(map(memory_item_keeps, m)) for m in values[::step]):
        return True
    DEEP_MEMORY.add(owner)
    return False


# -- pydantic models: State, Observation, Partial ----------------------------------------------

def to_wire(model: BaseModel, *, strict: bool = True) -> dict[str, Any]:
    """`model` as JSON (`model_dump(mode="json")`), its loose fields' values encoded: what
    `from_wire` gives back as `model` was. A value that cannot be kept raises StateTypeError naming
    the field (`strict`, a State), or travels as pydantic writes it (an Observation, a Partial:
    read the same in one process and on the fleet, as it always was)."""
    cls = type(model)
    odd = [name for name in loose_fields(cls) if not plain(getattr(model, name, None))]
    data = model.model_dump(mode="json", exclude=set(odd)) if odd else model.model_dump(mode="json")
    for name in odd:
        try:
            data[name] = {MARK: typed(getattr(model, name))}
        except StateTypeError as err:
            if strict:
                raise StateTypeError(f"{cls.__name__}.{name}: {err}; or declare the field's type") from None
            data[name] = model.model_dump(mode="json", include={name})[name]
    return data


def from_wire(cls: type[BaseModel], data: dict[str, Any]) -> BaseModel:
    """The model `to_wire` wrote (its loose fields' typed values rebuilt before validation)."""
    loose = loose_fields(cls)
    if loose and any(type(data.get(n)) is dict and MARK in data[n] for n in loose):
        data = {k: (decode(v) if k in loose else v) for k, v in data.items()}
    return cls.model_validate(data)


@functools.cache
def loose_fields(cls: type[BaseModel]) -> frozenset[str]:
    """The fields whose declared type does not say what their values are (`Any`, `list`,
    `dict[str, Any]`, `tuple[Any, ...]` …): pydantic would give a tuple in them back as a list."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return frozenset(name for name in cls.model_fields if _loose(hints.get(name, Any)))


_CONTAINERS = (list, dict, tuple, set, frozenset, deque)


def _loose(annotation: object) -> bool:
    if annotation is Any or annotation is object:
        return True
    if annotation in _CONTAINERS:
        return True  # a bare `list`: its items are Any
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *meta = typing.get_args(annotation)
        # a type with its own validator (the SDK's Ints, Floats) says what it holds
        return not any(type(m).__name__ in ("PlainValidator", "WrapValidator", "BeforeValidator") for m in meta) \
            and _loose(base)
    if origin is typing.Literal:
        return False
    args = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return False  # pydantic rebuilds a nested model (its own loose fields as pydantic gives them)
    if origin is not None and not args:
        return True
    return any(_loose(a) for a in args if a is not Ellipsis and a is not type(None))


# -- what a declared state field may hold, by its annotation (Simulation.check) -------------------

_KEPT = (int, float, str, bool, type(None), list, tuple, dict, set, frozenset, deque, Fraction)


def unkept(annotation: object) -> object | None:
    """The part of an agent state field's annotation a checkpoint cannot keep (e.g. `random.Random`
    in `list[random.Random]`), or None: everything it names may be kept (`Any` is checked when a
    checkpoint meets the value)."""
    if annotation is Any or annotation is object or annotation is None or annotation in _KEPT:
        return None
    origin = typing.get_origin(annotation)
    if origin is typing.Literal or origin is typing.ClassVar:
        return None
    if origin is typing.Annotated:
        return unkept(typing.get_args(annotation)[0])
    if origin is not None:
        # a container the value may be kept as (`Sequence[int]` holding a tuple), or a union
        if origin not in _KEPT and origin not in (typing.Union, types.UnionType) \
                and getattr(origin, "__module__", "") != "collections.abc":
            return annotation
        for arg in typing.get_args(annotation):
            if arg is not Ellipsis and (found := unkept(arg)) is not None:
                return found
        return None
    return annotation


def _short(value: object, limit: int = 60) -> str:
    try:
        text = repr(value)
    except Exception:  # pragma: no cover - a repr that raises
        text = object.__repr__(value)
    return text if len(text) <= limit else text[:limit] + "…"


__all__ = ["MARK", "StateTypeError", "decode", "decode_state", "encode", "encode_column", "from_wire",
           "loose_fields", "memory_item_keeps", "plain", "to_wire", "typed", "unkept", "untyped"]
