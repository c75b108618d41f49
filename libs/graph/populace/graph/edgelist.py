"""Edge list files (CSV or Parquet: ``source,target[,weight]``), read with pyarrow and checked
row by row — vectorised — before anything starts. The first bad row is named, e.g.
``graph.path: follows.csv row 17 (line 18): target 1200 is not an agent id (agents are 0..999)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from populace.graph.config import GraphError
from populace.graph.csr import Graph, from_edges

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["load_edge_list", "read_edge_table"]

_COLUMNS = ("source", "target", "weight")


def read_edge_table(path: Path) -> pa.Table:
    """The file's table, with its columns checked by name (GraphError otherwise)."""
    where = f"graph.path: {path}"
    try:
        import pyarrow as pa  # here: a run without an edge-list file (and an author's SDK) never loads Arrow
    except ModuleNotFoundError:
        raise GraphError(f"{where}: an edge-list file is read with pyarrow, which populace-sdk alone does not "
                         "install: pip install 'populace-graph[fleet]' (or pyarrow)") from None
    try:
        if path.suffix.lower() == ".csv":
            import pyarrow.csv as pacsv

            table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
                column_types={"source": pa.int64(), "target": pa.int64(), "weight": pa.float64()}))
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(path)
    except FileNotFoundError:
        raise GraphError(f"{where}: no such file") from None
    except OSError as err:
        raise GraphError(f"{where}: cannot read ({err})") from None
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise GraphError(f"{where}: not a readable edge list: {err}") from None
    names = table.column_names
    missing = [c for c in ("source", "target") if c not in names]
    extra = [c for c in names if c not in _COLUMNS]
    if missing or extra:
        raise GraphError(f"{where}: columns must be source,target[,weight] "
                         f"(got {','.join(names) or 'none'})")
    return table


def _column(table: pa.Table, name: str, where: str, kind: str) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    col = table.column(name)
    if col.null_count:
        row = int(pc.index(pc.is_null(col), True).as_py())
        raise GraphError(f"{where(row)}: {name} is empty")
    if kind == "int":
        if not pa.types.is_integer(col.type):
            raise GraphError(f"graph.path: column {name} must hold integer agent ids (got {col.type})")
        return col.to_numpy().astype(np.int64, copy=False)
    if not (pa.types.is_floating(col.type) or pa.types.is_integer(col.type)):
        raise GraphError(f"graph.path: column {name} must hold numbers (got {col.type})")
    return col.to_numpy().astype(np.float64, copy=False)


def load_edge_list(path: str | Path, n: int, *, directed: bool, self_loops: bool) -> Graph:
    """The graph of an edge list file over agents 0..n-1, or GraphError naming the first bad
    row: an id outside 0..n-1, a self-loop when not allowed, a weight that is not finite and
    positive, an edge listed twice (for an undirected graph, a→b and b→a are the same edge)."""
    path = Path(path)
    table = read_edge_table(path)
    csv = path.suffix.lower() == ".csv"

    def where(row: int) -> str:  # row: 0-based data row
        line = f" (line {row + 2})" if csv else ""
        return f"graph.path: {path} row {row + 1}{line}"

    src = _column(table, "source", where, "int")
    dst = _column(table, "target", where, "int")
    w = _column(table, "weight", where, "float") if "weight" in table.column_names else None
    if src.size == 0:
        raise GraphError(f"graph.path: {path} holds no edges")
    for name, ids in (("source", src), ("target", dst)):
        bad = np.flatnonzero((ids < 0) | (ids >= n))
        if bad.size:
            row = int(bad[0])
            raise GraphError(f"{where(row)}: {name} {ids[row]} is not an agent id (agents are 0..{n - 1})")
    if not self_loops:
        bad = np.flatnonzero(src == dst)
        if bad.size:
            row = int(bad[0])
            raise GraphError(f"{where(row)}: self-loop {src[row]}→{dst[row]} (set graph.self_loops: true "
                             "to allow them)")
    if w is not None:
        bad = np.flatnonzero(~np.isfinite(w) | (w <= 0))
        if bad.size:
            row = int(bad[0])
            raise GraphError(f"{where(row)}: weight {float(w[row])!r} must be a finite number > 0")
    a, b = (src, dst) if directed else (np.minimum(src, dst), np.maximum(src, dst))
    key = a * n + b
    order = np.argsort(key, kind="stable")
    dup = np.flatnonzero(key[order][1:] == key[order][:-1])
    if dup.size:
        later = order[dup + 1]
        row = int(later.min())  # the first row that repeats an earlier one
        first = int(order[np.flatnonzero(key[order] == key[row])[0]])
        arrow = "→" if directed else "–"
        hint = "" if directed else " (undirected: list each edge once)"
        raise GraphError(f"{where(row)}: edge {src[row]}{arrow}{dst[row]} repeats row {first + 1}{hint}")
    return from_edges(n, src, dst, directed=directed, weights=w, self_loops=self_loops)
