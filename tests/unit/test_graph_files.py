"""Edge list files (CSV, Parquet) checked row by row, and the graph's canonical bytes."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from populace.graph import (
    GraphError,
    build_graph,
    digest,
    dumps,
    load_edge_list,
    loads,
    parse_graph,
    scale_free,
    small_world,
)


def csv(tmp_path, text: str, name: str = "g.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def refusal(path, n=10, directed=True, self_loops=False) -> str:
    with pytest.raises(GraphError) as info:
        load_edge_list(path, n, directed=directed, self_loops=self_loops)
    return str(info.value)


def test_csv_edge_list(tmp_path):
    g = load_edge_list(csv(tmp_path, "source,target\n0,1\n2,1\n1,3\n"), 5, directed=True, self_loops=False)
    assert g.in_neighbours(1).tolist() == [0, 2] and g.in_neighbours(3).tolist() == [1] and g.entries == 3
    u = load_edge_list(csv(tmp_path, "source,target\n0,1\n2,1\n"), 5, directed=False, self_loops=False)
    assert u.in_neighbours(1).tolist() == [0, 2] and u.in_neighbours(0).tolist() == [1] and u.edges == 2
    w = load_edge_list(csv(tmp_path, "source,target,weight\n0,1,0.5\n2,1,3\n"), 5, directed=True, self_loops=False)
    assert w.weights.tolist() == [0.5, 3.0]


def test_parquet_edge_list(tmp_path):
    p = tmp_path / "g.parquet"
    pq.write_table(pa.table({"source": np.array([3, 4], dtype=np.int32), "target": [0, 0],
                             "weight": [1.0, 2.0]}), p)
    g = load_edge_list(p, 5, directed=True, self_loops=False)
    assert g.in_neighbours(0).tolist() == [3, 4] and g.weights.tolist() == [1.0, 2.0]
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"source": [0, 1, 2], "target": [1, 2, 7]}), bad)
    assert refusal(bad, n=5) == f"graph.path: {bad} row 3: target 7 is not an agent id (agents are 0..4)"
    floats = tmp_path / "f.parquet"
    pq.write_table(pa.table({"source": [0.0], "target": [1.0]}), floats)
    assert refusal(floats).startswith("graph.path: column source must hold integer agent ids")


@pytest.mark.parametrize(("text", "kw", "want"), [
    ("source,target\n0,1\n1,10\n", {}, "row 2 (line 3): target 10 is not an agent id (agents are 0..9)"),
    ("source,target\n-1,1\n", {}, "row 1 (line 2): source -1 is not an agent id"),
    ("source,target\n0,1\n4,4\n", {}, "row 2 (line 3): self-loop 4→4 (set graph.self_loops: true"),
    ("source,target\n0,1\n2,3\n0,1\n", {}, "row 3 (line 4): edge 0→1 repeats row 1"),
    ("source,target\n0,1\n1,0\n", {"directed": False}, "row 2 (line 3): edge 1–0 repeats row 1 (undirected: list each edge once)"),
    ("source,target,weight\n0,1,1\n0,2,-2\n", {}, "row 2 (line 3): weight -2.0 must be a finite number > 0"),
    ("source,target\n0,1\n,2\n", {}, "row 2 (line 3): source is empty"),
])
def test_bad_rows_are_named(tmp_path, text, kw, want):
    p = csv(tmp_path, text)
    assert refusal(p, **kw).startswith(f"graph.path: {p} {want}")


def test_bad_files(tmp_path):
    assert refusal(tmp_path / "none.csv").endswith("none.csv: no such file")
    assert "columns must be source,target[,weight] (got from,to)" in refusal(csv(tmp_path, "from,to\n0,1\n"))
    assert "not a readable edge list" in refusal(csv(tmp_path, "source,target\n0,x\n"))
    assert refusal(csv(tmp_path, "source,target\n")).endswith("holds no edges")


def test_self_loops_allowed_when_asked(tmp_path):
    g = load_edge_list(csv(tmp_path, "source,target\n4,4\n"), 5, directed=True, self_loops=True)
    assert g.in_neighbours(4).tolist() == [4]


def test_build_graph_reads_relative_to_the_scenario(tmp_path):
    csv(tmp_path, "source,target\n0,1\n", "follows.csv")
    cfg = parse_graph({"generator": "edges", "path": "follows.csv", "directed": True}, agents=3)
    assert build_graph(cfg, 3, seed=0, base=tmp_path).in_neighbours(1).tolist() == [0]


def test_round_trip_and_stable_digest(tmp_path):
    g = scale_free(5000, 3, seed=1)
    data = dumps(g)
    back = loads(data, expect_digest=digest(data))
    assert np.array_equal(back.offsets, g.offsets) and np.array_equal(back.sources, g.sources)
    assert (back.n, back.directed, back.weights) == (g.n, g.directed, None)
    assert dumps(scale_free(5000, 3, seed=1)) == data  # same config and seed: same bytes
    assert digest(data) == hashlib.sha256(data).hexdigest()
    assert digest(dumps(scale_free(5000, 3, seed=2))) != digest(data)
    assert g.nbytes == 8 * 5001 + 4 * g.entries and len(data) - g.nbytes < 120  # header is small
    w = load_edge_list(csv(tmp_path, "source,target,weight\n0,1,0.25\n"), 3, directed=True, self_loops=False)
    assert loads(dumps(w)).weights.tolist() == [0.25]


def test_loads_refuses_what_is_not_a_graph():
    data = dumps(small_world(100, 4, 0.1, seed=0))
    with pytest.raises(GraphError, match="do not match their digest"):
        loads(data, expect_digest="0" * 64)
    with pytest.raises(GraphError, match="bad magic"):
        loads(b"NOTGRAPH" + data[8:])
    with pytest.raises(GraphError, match="bytes, expected"):
        loads(data[:-4])
    corrupt = bytearray(data)
    corrupt[-4:] = (10**6).to_bytes(4, "little")  # an in-neighbour that is not an agent
    with pytest.raises(GraphError, match="not an agent id"):
        loads(bytes(corrupt))
    unsorted = bytearray(data)
    unsorted[-8:] = unsorted[-4:] + unsorted[-8:-4]  # swap the last row's two last sources
    with pytest.raises(GraphError, match="not sorted"):
        loads(bytes(unsorted))
