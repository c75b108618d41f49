"""The tables the report's shape sections draw (populace.analysis.shapes), on databases written by
the recorder's real Store:

- the follow graph's degree distributions on a tiny hand-made edges table, exactly, and equal to
  populace.sdk.edges.rebuild's graph after every round;
- a small feed run played locally: the graph's edges standing equal the summary's follows since
  round 1 (a run without a starting graph), the distribution per group counts every valid stance;
- a small Schelling run played locally: the like-neighbour share of each round's grid picture
  equals the simulation's own summary `like_share`;
- a ratio-game run gets none of these sections (its report stays as it was);
- the report of each renders its sections."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from populace.analysis import render_report
from populace.analysis.queries import round_table, run_info, tables_of
from populace.analysis.report.shapes import shape_sections
from populace.analysis.shapes import degree_table, grid_frames, measure_distribution, starting_graph
from populace.client import simulate
from populace.core.contracts import Column, RunConfig, SimulationTables
from populace.sdk.edges import rebuild
from populace.store.local_runs import record_local

# a run of 5 agents over 3 rounds; (round, follower, author, op) in the order they applied (by
# round, then follower, then the order the follower's outcome listed them)
EDITS = [(1, 0, 1, "add"), (1, 0, 4, "add"), (1, 2, 1, "add"), (1, 3, 1, "add"),
         (2, 2, 1, "remove"), (2, 2, 1, "add"), (2, 2, 1, "remove"), (2, 4, 0, "add"),
         (3, 0, 1, "remove"), (3, 1, 0, "add"), (3, 3, 0, "add")]


def _handmade(db) -> str:
    tables = SimulationTables(simulation="handmade", outcomes="hand_outcomes",
                              outcome_columns=[Column(name="stance", type="BIGINT")], rounds="hand_rounds",
                              summary_columns=[], measure="stance", measure_kind="numeric", edge_kinds=["follow"])
    config = RunConfig(simulation="handmade", agents=5, rounds=3)
    rows = [(r, a) for r in (1, 2, 3) for a in range(5)]
    outcomes = {"round": [r for r, _ in rows], "agent_id": [a for _, a in rows], "stance": [a % 3 for _, a in rows],
                "valid": [True] * len(rows), "raw": [""] * len(rows), "latency_ms": [1.0] * len(rows),
                "error": [None] * len(rows)}
    rounds = {"round": [1, 2, 3], "n": [5, 5, 5], "n_valid": [5, 5, 5]}
    edges = {"round": [e[0] for e in EDITS], "follower": [e[1] for e in EDITS], "author": [e[2] for e in EDITS],
             "kind": ["follow"] * len(EDITS), "op": [e[3] for e in EDITS]}
    record_local(db, run_id="hand", config=config, tables=tables, outcomes=outcomes, rounds=rounds, edges=edges)
    return "hand"


def test_degree_distributions_of_a_hand_made_edges_table_are_exact(tmp_path):
    db = tmp_path / "hand.duckdb"
    run_id = _handmade(db)
    with duckdb.connect(str(db), read_only=True) as con:
        table = degree_table(con, run_id)
        recorded = con.execute("SELECT round, follower, author, op FROM edges WHERE run_id = ? ORDER BY round, rowid",
                               [run_id]).fetchall()
    assert recorded == EDITS  # recorded in the order they applied (an agent's edits in its outcome's order)
    # after round 1: 0 follows {1, 4}, 2 and 3 follow {1}
    # after round 2: 2 unfollowed 1, followed and unfollowed again: {}; 4 follows {0}
    # after round 3: 1 and 3 follow 0; 0 unfollows 1 -> 0 {4}, 1 {0}, 3 {1, 0}, 4 {0}
    assert [(t["round"], t["adds"], t["removes"], t["edges"]) for t in table] == [(1, 4, 0, 4), (2, 2, 2, 4),
                                                                                  (3, 2, 1, 5)]
    assert [t["out_degree"] for t in table] == [{0: 2, 1: 2, 2: 1}, {0: 2, 1: 2, 2: 1}, {0: 1, 1: 3, 2: 1}]
    # in-degree (followers): r1: 1 has 3, 4 has 1; r2: 1 has 2, 4 has 1, 0 has 1; r3: 0 has 3, 1 has 1, 4 has 1
    assert [t["in_degree"] for t in table] == [{0: 3, 1: 1, 3: 1}, {0: 2, 1: 2, 2: 1}, {0: 2, 1: 2, 3: 1}]
    assert [(t["max_in"], t["max_out"], t["mean_degree"]) for t in table] == [(3, 2, 0.8), (2, 2, 0.8), (3, 2, 1.0)]
    for t in table:  # the same graph as the SDK's rebuild
        graph = rebuild(5, None, [(r, f, a, op) for r, f, a, op in EDITS], t["round"])
        out = np.zeros(5, int)
        for follower, authors in graph.items():
            out[follower] = len(authors)
        assert sum(out) == t["edges"]
        assert dict(zip(*np.unique(out, return_counts=True))) == t["out_degree"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A small feed run (no starting graph, a population with activity levels) and a small
    Schelling run, played locally and recorded in one file."""
    db = str(tmp_path_factory.mktemp("shapes") / "shapes.duckdb")
    feed = simulate("examples/feed.yaml", local=True, db=db, agents=120, rounds=4, graph=None,
                    pool={"size": 200, "seed_posts": 60}, model={"backend": "dummy", "latency_s": 0.0, "seed": 1})
    schelling = simulate("examples/schelling.yaml", local=True, db=db, agents=150, rounds=4,
                         grid={"width": 15, "height": 14, "torus": True, "kinds": 2})
    ratio = simulate({"simulation": "ratio-game", "agents": 12, "rounds": 2}, local=True, db=db)
    followed = simulate("examples/feed.yaml", local=True, db=db, agents=120, rounds=3,  # its scale-free graph
                        pool={"size": 200, "seed_posts": 60}, model={"backend": "dummy", "latency_s": 0.0, "seed": 1})
    return db, feed.run_id, schelling.run_id, ratio.run_id, followed.run_id


def test_the_feed_graph_equals_its_summary_and_the_distribution_counts_every_valid_stance(runs):
    db, feed, *_ = runs
    with duckdb.connect(db, read_only=True) as con:
        assert tables_of(con, feed).config.get("graph") is None
        table = degree_table(con, feed)
        summary = con.execute("SELECT round, net_follows, follows, unfollows FROM feed_rounds WHERE run_id = ? "
                              "ORDER BY round", [feed]).fetchall()
        assert [(t["round"], t["edges"], t["adds"], t["removes"]) for t in table] == summary
        assert any(t["edges"] for t in table)
        for t in table:
            assert sum(t["in_degree"].values()) == sum(t["out_degree"].values()) == 120
            assert sum(d * n for d, n in t["in_degree"].items()) == t["edges"]
        dist = measure_distribution(con, feed, "activity", [1, 4])
        assert dist["categories"] == ["-3", "-2", "-1", "0", "1", "2", "3"]
        for r in (1, 4):
            want = dict(con.execute(
                "SELECT p.profile->>'activity', count(*) FROM feed_outcomes o JOIN agent_profiles p USING (run_id, "
                "agent_id) WHERE run_id = ? AND round = ? AND valid AND stance IS NOT NULL GROUP BY 1",
                [feed, r]).fetchall())
            got = {row["group"]: row["n"] for row in dist["rows"] if row["round"] == r}
            assert got == want
            assert all(sum(row["counts"].values()) == row["n"] for row in dist["rows"])


def test_the_like_neighbour_share_of_the_grid_equals_schellings_summary(runs):
    db, _, schelling, *_ = runs
    with duckdb.connect(db, read_only=True) as con:
        frames = grid_frames(con, schelling, [1, 2, 3, 4])
        summary = con.execute("SELECT round, like_share FROM schelling_rounds WHERE run_id = ? ORDER BY round",
                              [schelling]).fetchall()
    assert [f.round for f in frames] == [r for r, _ in summary]
    for f, (_, like) in zip(frames, summary, strict=True):
        assert f.agents == 150 and f.clashes == 0 and f.colours == ["0", "1"]
        assert f.occupant_colour.shape == (14, 15) and int((f.occupant_colour >= 0).sum()) == 150
        assert f.like_share == pytest.approx(like, rel=1e-12)


def test_each_run_gets_the_sections_of_its_shape_and_the_ratio_game_none(runs):
    db, feed, schelling, ratio, _ = runs
    with duckdb.connect(db, read_only=True) as con:
        def titles(run_id, attrs):
            info = run_info(con, run_id)
            sections = shape_sections(con, run_id, info, round_table(con, run_id), tables_of(con, run_id).summary_types,
                                      attrs)
            return [s.anchor for s in sections]

        assert titles(feed, ["activity"]) == ["activity", "distribution", "graph"]
        assert titles(schelling, []) == ["activity", "grid"]
        assert titles(ratio, []) == []
        for run_id, wanted in ((feed, 'id="graph"'), (schelling, 'id="grid"')):
            assert wanted in render_report(con, run_id)


def test_a_feed_on_a_starting_graph_is_rebuilt_on_it_exactly(runs):
    """The run's `graph:` rebuilt from its config (checked by digest), plus its edits: the SDK's
    rebuild after every round, and the summary's follows since round 1 on top of its edges."""
    db, *_, followed = runs
    with duckdb.connect(db, read_only=True) as con:
        base, why_not = starting_graph(con, followed)
        assert why_not is None and base is not None and base.n == 120 and base.edges > 0
        table = degree_table(con, followed, base)
        edits = con.execute("SELECT round, follower, author, op FROM edges WHERE run_id = ? ORDER BY round, rowid",
                            [followed]).fetchall()
        net = dict(con.execute("SELECT round, net_follows FROM feed_rounds WHERE run_id = ?", [followed]).fetchall())
    assert [t["round"] for t in table] == [1, 2, 3] and edits
    for t in table:
        graph = rebuild(120, base, edits, t["round"])
        out = np.zeros(120, int)
        ins = np.zeros(120, int)
        for follower, authors in graph.items():
            out[follower] = len(authors)
            for a in authors:
                ins[a] += 1
        assert dict(zip(*np.unique(out, return_counts=True))) == t["out_degree"]
        assert dict(zip(*np.unique(ins, return_counts=True))) == t["in_degree"]
        assert t["edges"] == base.edges + net[t["round"]]  # a follow adds an edge it lacked, an unfollow removes one
