"""Worlds: an environment's bulk state as typed columns — per agent, per cell of a grid, a pool of
posts — kept by the environment and read by every host, never parsed as JSON.

    from populace.sdk.world import World, column

    class Town(World):
        cell = column("int32", "agents")       # each agent's cell
        kind = column("int8", "agents")
        occupant = column("int32", "cells")    # who is in each cell (-1: empty)

    town = Town(sizes={"agents": 1000, "cells": 2500}, cell=..., kind=..., occupant=...)
    town.cell[17]                              # a read-only numpy array

A world travels by digest: each round's announcement names it, a host fetches it once per round
(Arrow IPC, one record batch per size), and a checkpoint keeps its digest, so a restarted
environment, a re-placed host, a resume and a fork all read the very same world. Columns are
numpy arrays, read-only once built: an environment's `decide` returns a new world (or the same
object, unchanged), never edits one in place."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from populace.core.extras import fleet_missing
from populace.core.settings import AGENT_BYTES  # noqa: F401  (an agent's bytes on its host: one assumption)

if TYPE_CHECKING:
    import pyarrow as pa

# What a column may hold: numpy's fixed-width types, and text (Arrow strings).
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32",
          "float64", "string")
_MAGIC = b"POPWORLD1"
# What memory checks count before a run (the values are not known yet): a text value's bytes (its
# offset and a short text, e.g. a post), and an agent's on its host (AGENT_BYTES).
STRING_BYTES = 64


class WorldError(ValueError):
    """A world that does not match its declaration (the message names the column and why)."""


class Column:
    """A declared column: its type and the size it is as long as (a name the simulation sizes)."""

    __slots__ = ("dtype", "name", "size")

    def __init__(self, dtype: str, size: str) -> None:
        if dtype not in DTYPES:
            raise WorldError(f"column type {dtype!r}: one of {', '.join(DTYPES)}")
        if not isinstance(size, str) or not size.isidentifier():
            raise WorldError(f"column size {size!r}: the name of a size, e.g. 'agents' or 'cells'")
        self.dtype, self.size, self.name = dtype, size, ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, world: World | None, owner: type) -> Any:
        if world is None:
            return self
        return world._data[self.name]

    def __set__(self, world: World, value: Any) -> None:
        raise AttributeError(f"{type(world).__name__}.{self.name}: a world's columns are read-only; "
                             "build a new world (world.replace(...)) in decide")

    def __repr__(self) -> str:
        return f"column({self.dtype!r}, {self.size!r})"


def column(dtype: str, size: str) -> Any:
    """Declare a world column (see the module's docstring)."""
    return Column(dtype, size)


class World:
    """Base of a simulation's world (see the module's docstring)."""

    columns: ClassVar[dict[str, Column]] = {}
    __slots__ = ("_data", "_digest", "sizes")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.columns = {k: v for base in reversed(cls.__mro__) for k, v in vars(base).items() if isinstance(v, Column)}

    def __init__(self, sizes: Mapping[str, int], **values: Any) -> None:
        cls = type(self)
        where = cls.__name__
        needed = {c.size for c in cls.columns.values()}
        missing = sorted(needed - set(sizes))
        if missing:
            raise WorldError(f"{where}: sizes {missing} are not given (sizes={dict(sizes)})")
        for name, n in sizes.items():
            if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
                raise WorldError(f"{where}: size {name!r} is {n!r}, not a whole number >= 0")
        unknown = sorted(set(values) - set(cls.columns))
        if unknown:
            raise WorldError(f"{where}: {unknown} are not its columns ({', '.join(cls.columns) or 'none'})")
        self.sizes = {k: int(v) for k, v in sizes.items()}
        self._digest: str | None = None
        self._data: dict[str, np.ndarray] = {}
        for name, col in cls.columns.items():
            self._data[name] = _checked(f"{where}.{name}", col, values.get(name), self.sizes[col.size])

    # -- building another world -------------------------------------------------------------
    @classmethod
    def empty(cls, sizes: Mapping[str, int]) -> World:
        """Every column zero (or empty text), of its size."""
        return cls(sizes)

    def replace(self, sizes: Mapping[str, int] | None = None, **values: Any) -> World:
        """A new world with these columns (and sizes) changed; the others are shared."""
        data = {**self._data, **values}
        return type(self)(sizes or self.sizes, **data)

    @classmethod
    def estimate(cls, sizes: Mapping[str, int]) -> list[tuple[str, int]]:
        """(column, bytes) of a world of these sizes, largest first: each column's value size
        (text: STRING_BYTES) times the length of its size. WorldError naming a size not given."""
        missing = sorted({c.size for c in cls.columns.values()} - set(sizes))
        if missing:
            raise WorldError(f"{cls.__name__}: sizes {missing} are not given (sizes={dict(sizes)})")
        parts = [(f"{cls.__name__}.{name} ({col.dtype} × {col.size} {int(sizes[col.size]):,})",
                  (STRING_BYTES if col.dtype == "string" else np.dtype(col.dtype).itemsize) * int(sizes[col.size]))
                 for name, col in cls.columns.items()]
        return sorted(parts, key=lambda p: -p[1])

    # -- the wire ----------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """Arrow IPC, one record batch per size (in name order), after a small JSON header."""
        pa = _arrow()
        cls = type(self)
        groups: dict[str, list[str]] = {}
        for name, col in cls.columns.items():
            groups.setdefault(col.size, []).append(name)
        out = io.BytesIO()
        header = json.dumps({"world": cls.__name__, "sizes": self.sizes,
                             "groups": {k: groups[k] for k in sorted(groups)}}, sort_keys=True).encode()
        out.write(_MAGIC + len(header).to_bytes(4, "little") + header)
        for size in sorted(groups):
            arrays = [_to_arrow(self._data[name], cls.columns[name].dtype) for name in groups[size]]
            batch = pa.RecordBatch.from_arrays(arrays, names=groups[size])
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as writer:
                writer.write_batch(batch)
            body = sink.getvalue().to_pybytes()
            out.write(len(body).to_bytes(8, "little") + body)
        return out.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> World:
        """A world read back from `to_bytes` (WorldError naming what does not match)."""
        pa = _arrow()
        if not data.startswith(_MAGIC):
            raise WorldError(f"{cls.__name__}: not a world's bytes")
        view = memoryview(data)
        at = len(_MAGIC)
        n = int.from_bytes(view[at:at + 4], "little")
        header = json.loads(bytes(view[at + 4:at + 4 + n]))
        at += 4 + n
        if header.get("world") != cls.__name__:
            raise WorldError(f"{cls.__name__}: the bytes hold a {header.get('world')!r} world")
        values: dict[str, Any] = {}
        for size in sorted(header["groups"]):
            length = int.from_bytes(view[at:at + 8], "little")
            at += 8
            with pa.ipc.open_stream(pa.py_buffer(view[at:at + length])) as reader:
                table = reader.read_all()
            at += length
            for name in header["groups"][size]:
                col = cls.columns.get(name)
                if col is None:
                    raise WorldError(f"{cls.__name__}: the bytes hold a column {name!r} it does not declare")
                values[name] = _from_arrow(table.column(name), col.dtype)
        world = cls(header["sizes"], **values)
        world._digest = hashlib.sha256(data).hexdigest()
        return world

    @property
    def digest(self) -> str:
        """sha256 of its bytes: what a round's announcement and a checkpoint name it by."""
        if self._digest is None:
            self._digest = hashlib.sha256(self.to_bytes()).hexdigest()
        return self._digest

    def nbytes(self) -> int:
        return sum(a.nbytes if a.dtype != object else sum(len(s) for s in a) for a in self._data.values())

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.digest == self.digest  # type: ignore[union-attr]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sizes={self.sizes})"


def _checked(where: str, col: Column, value: Any, n: int) -> np.ndarray:
    """The value as a read-only array of the column's type and length, or WorldError."""
    if value is None:
        arr = np.full(n, "", dtype=object) if col.dtype == "string" else np.zeros(n, dtype=col.dtype)
    elif col.dtype == "string":
        arr = np.asarray(value, dtype=object)
        if arr.ndim != 1 or not all(isinstance(s, str) for s in arr.tolist()):
            raise WorldError(f"{where}: a string column holds text only")
    else:
        arr = np.asarray(value)
        if arr.ndim != 1:
            raise WorldError(f"{where}: one value per row, not an array of shape {arr.shape}")
        target = np.dtype(col.dtype)
        if arr.dtype != target:
            if arr.size and not np.can_cast(arr.dtype, target, casting="same_kind"):
                raise WorldError(f"{where}: {arr.dtype} values do not fit a {col.dtype} column")
            cast = arr.astype(target)
            if arr.size and arr.dtype.kind in "iuf" and not np.array_equal(cast, arr):
                raise WorldError(f"{where}: values do not fit a {col.dtype} column (they would change)")
            arr = cast
    if len(arr) != n:
        raise WorldError(f"{where}: {len(arr)} values, but its size {col.size!r} is {n}")
    if arr.flags.writeable:
        arr = arr.copy() if value is not None and np.shares_memory(arr, np.asarray(value)) else arr
        arr.flags.writeable = False
    return arr


def _arrow() -> Any:
    """pyarrow, imported here: an author's SDK loads Arrow only when a world crosses a wire (its
    bytes, digest, equality), and says which extra installs it where it is missing."""
    try:
        import pyarrow
    except ModuleNotFoundError as missing:
        raise fleet_missing("a world's bytes (World.to_bytes, from_bytes, digest, ==: Arrow IPC)", missing) from missing
    return pyarrow


def _to_arrow(arr: np.ndarray, dtype: str) -> pa.Array:
    pa = _arrow()
    return pa.array(arr.tolist(), type=pa.string()) if dtype == "string" else pa.array(arr)


def _from_arrow(chunked: pa.ChunkedArray, dtype: str) -> np.ndarray:
    if dtype == "string":
        return np.asarray(chunked.to_pylist(), dtype=object)
    return chunked.to_numpy()
