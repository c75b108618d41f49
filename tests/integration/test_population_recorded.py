"""A population that changed, recorded (issue 37) by the recorder's real Store from a run played in
one process (`simulate(local=True)`), as `results`, `report` and `export` read it: table
`population` holds every departure and newcomer with its reason, `agents` every id the run gave,
the outcomes newcomers' rows; the report's Population section counts who lived in each round
and who came and went after it, from those rows; a run that never changed has no such section."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import duckdb
import pytest

from populace.analysis import render_report
from populace.analysis.queries.population import population_rounds
from populace.client import simulate

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e" / "sims"))

CHANGES = {"changes": [{"after": "every", "left": 0.1, "reason": "moved", "arrived": 5}, {"after": [2], "died": 0.2}]}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("population") / "population.duckdb")
    changed = simulate({"simulation": "lifecycle_sims:Wanderers", "agents": 80, "rounds": 4, "seed": 2,
                        "population": CHANGES}, local=True, db=db)
    born = simulate({"simulation": "lifecycle_sims:Foragers", "agents": 50, "rounds": 4}, local=True, db=db)
    plain = simulate({"simulation": "ratio-game", "agents": 12, "rounds": 2}, local=True, db=db)
    for r in (changed, born, plain):
        assert r.status == "completed", r.reason
    return db, changed, born, plain


def test_the_population_table_holds_every_change_with_its_reason(recorded):
    db, changed, born, _ = recorded
    with duckdb.connect(db, read_only=True) as con:
        rows = con.execute("SELECT round, agent_id, event, reason FROM population WHERE run_id = ? "
                           "ORDER BY round, agent_id", [changed.run_id]).fetchall()
        assert rows == sorted(zip(*(changed.local.population[k] for k in ("round", "agent_id", "event", "reason"))))
        assert Counter((r, e) for r, _, e, _ in rows)[(2, "died")] > 0
        assert {why for _, _, e, why in rows if e == "left"} == {"moved"}
        newest = con.execute("SELECT max(agent_id) FROM agents WHERE run_id = ?", [born.run_id]).fetchone()[0]
        births = con.execute("SELECT count(*) FROM population WHERE run_id = ? AND event = 'born'",
                             [born.run_id]).fetchone()[0]
        assert births and newest == 50 + births - 1  # every id the run gave, newcomers' too
        oldest_newcomer = con.execute("SELECT min(agent_id) FROM foragers_outcomes WHERE run_id = ? AND agent_id >= 50",
                                      [born.run_id]).fetchone()[0]
        assert oldest_newcomer == 50


def test_the_report_counts_who_lived_in_each_round_and_who_came_and_went(recorded):
    db, changed, _, plain = recorded
    with duckdb.connect(db, read_only=True) as con:
        table = population_rounds(con, changed.run_id, 80, 4)
        assert population_rounds(con, plain.run_id, 12, 2) == []
        html = render_report(con, changed.run_id)
        plain_html = render_report(con, plain.run_id)
    p = changed.local.population
    counts = Counter(zip(p["round"], p["event"]))
    living = 80
    for row in table:  # who played each round: the first agents, with the comings and goings before it
        assert row["living"] == living and row["left"] == counts[(row["round"], "left")]
        living += row["arrived"] - row["left"] - row["died"]
    assert [r["living"] for r in table] == changed.local.rounds["living"]  # the simulation's own count
    assert 'id="population"' in html and ">living agents<" in html and 'id="population"' not in plain_html
