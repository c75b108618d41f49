"""The run page's live reads (populace.analysis.live) against an in-memory DuckDB shaped like
the recorder's: a page of agents (search by id or by words of the profile/persona, paging,
each round's outcome columns, valid, raw cut short, error) and a round's distribution
(histogram with the report's bins, or each option's share). POPULACE_BENCH=1 also times them on
a million agents × 3 rounds."""

from __future__ import annotations

import json
import os
import time

import duckdb
import pytest

from populace.analysis.bins import histogram_bins
from populace.analysis.live import RAW_CHARS, agents_page, round_distribution
from populace.analysis.stats import AnalysisError
from populace.core.contracts import Column, RunConfig, SimulationTables
from populace.store.store import SCHEMA, outcome_columns, summary_columns

NUMERIC = SimulationTables(simulation="t-num", outcomes="picks", outcome_columns=[Column(name="value", type="DOUBLE")],
                           rounds="pick_rounds", summary_columns=[Column(name="mean", type="DOUBLE"),
                                                                  Column(name="target", type="DOUBLE")],
                           measure="value", measure_kind="numeric", measure_range=(0.0, 100.0))
CATEGORICAL = SimulationTables(simulation="t-cat", outcomes="ballots",
                               outcome_columns=[Column(name="choice", type="VARCHAR"),
                                                Column(name="why", type="VARCHAR")],
                               rounds="ballot_rounds", summary_columns=[Column(name="leader", type="VARCHAR")],
                               measure="choice", measure_kind="categorical")
PERSONAS = [("teacher", "Maria Lopez", "A 34-year-old teacher from Lisbon"),
            ("farmer", "John Smith", "A farmer who likes chess"),
            ("teacher", "Sara Chess", "A retired teacher")]


def _create(con, spec: SimulationTables) -> None:
    for table, cols in ((spec.outcomes, outcome_columns(spec)), (spec.rounds, summary_columns(spec))):
        con.execute(f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(f'{n} {t}' for n, t in cols)})")


def _run(con, rid: str, spec: SimulationTables, agents: int) -> None:
    config = RunConfig(agents=agents, rounds=3, name=rid).model_dump_json()
    con.execute("INSERT INTO runs (run_id, started_at, config_json, status, simulation, tables_json) "
                "VALUES (?, now(), ?, 'running', ?, ?)", [rid, config, spec.simulation, spec.model_dump_json()])


@pytest.fixture
def con():
    c = duckdb.connect(":memory:")
    c.execute(SCHEMA)
    for spec in (NUMERIC, CATEGORICAL):
        _create(c, spec)
    # numeric run: 10 agents, rounds 1-2 closed, round 3 in play (agents 0-4 answered)
    _run(c, "num", NUMERIC, 10)
    for r in (1, 2):
        for a in range(10):
            valid = not (r == 2 and a == 7)
            c.execute("INSERT INTO picks VALUES ('num', ?, ?, ?, ?, ?, 5.0, ?)",
                      [r, a, float(a * 10 + r) if valid else None, valid, ("x" * 500 if a == 3 else f"I pick {a}"),
                       None if valid else "not a number"])
        c.execute("INSERT INTO pick_rounds (run_id, round, n, n_valid, mean, target) VALUES ('num', ?, 10, 10, ?, ?)",
                  [r, 45.0 + r, 30.0])
    for a in range(5):
        c.execute("INSERT INTO picks VALUES ('num', 3, ?, ?, true, 'r3', 1.0, NULL)", [a, float(a)])
    for a in range(10):
        job, name, desc = PERSONAS[a % 3]
        c.execute("INSERT INTO agent_profiles VALUES ('num', ?, ?, ?, ?)",
                  [a, a, json.dumps({"job": job, "age": 20 + a}), json.dumps({"name": name, "description": desc})])
    # categorical run: 6 agents, one round closed, no personas
    _run(c, "cat", CATEGORICAL, 6)
    for a, choice in enumerate(["yes", "yes", "no", "yes", "no", "abstain"]):
        c.execute("INSERT INTO ballots VALUES ('cat', 1, ?, ?, 'because', true, ?, 1.0, NULL)", [a, choice, choice])
    c.execute("INSERT INTO ballot_rounds (run_id, round, n, n_valid, leader) VALUES ('cat', 1, 6, 6, 'yes')")
    yield c
    c.close()


def test_a_page_of_agents_with_each_rounds_outcome(con):
    page = agents_page(con, "num", limit=4)
    assert (page["total"], page["columns"], page["rounds"], page["personas"]) == (10, ["value"], [1, 2, 3], True)
    assert [a["agent_id"] for a in page["agents"]] == [0, 1, 2, 3]
    first = page["agents"][0]
    assert first["profile"] == "job: teacher · age: 20"
    assert first["persona"] == "Maria Lopez — A 34-year-old teacher from Lisbon"
    assert [(c["round"], c["values"]["value"], c["valid"], c["raw"]) for c in first["rounds"]] == [
        (1, 1.0, True, "I pick 0"), (2, 2.0, True, "I pick 0"), (3, 0.0, True, "r3")]
    long = page["agents"][3]["rounds"][0]["raw"]
    assert len(long) == RAW_CHARS and long.endswith("…")
    nxt = agents_page(con, "num", offset=4, limit=4)
    assert [a["agent_id"] for a in nxt["agents"]] == [4, 5, 6, 7]
    bad = nxt["agents"][3]["rounds"][1]
    assert (bad["valid"], bad["values"]["value"], bad["error"]) == (False, None, "not a number")
    assert [c["round"] for c in nxt["agents"][3]["rounds"]] == [1, 2]  # round 3 not answered yet
    assert agents_page(con, "num", offset=10)["agents"] == []


def test_search_by_id_or_by_words_in_profile_and_persona(con):
    assert [a["agent_id"] for a in agents_page(con, "num", search="7")["agents"]] == [7]
    assert agents_page(con, "num", search="#12")["total"] == 0  # no such agent
    chess = agents_page(con, "num", search="CHESS")  # the farmer likes it; Sara's name is Chess
    assert chess["total"] == 6 and [a["agent_id"] for a in chess["agents"]] == [1, 2, 4, 5, 7, 8]
    both = agents_page(con, "num", search="chess teacher")  # every word must appear
    assert [a["agent_id"] for a in both["agents"]] == [2, 5, 8]
    paged = agents_page(con, "num", search="chess", offset=4, limit=3)
    assert paged["total"] == 6 and [a["agent_id"] for a in paged["agents"]] == [7, 8]
    assert agents_page(con, "num", search="chess", offset=50)["total"] == 6
    quote = agents_page(con, "num", search="x' OR 1=1 --")  # bound, never pasted into the SQL
    assert quote["total"] == 0
    assert agents_page(con, "num", search="lisbon")["total"] == 4
    cat = agents_page(con, "cat", search="yes")  # no personas: words match nothing
    assert (cat["personas"], cat["total"]) == (False, 0)


def test_a_long_run_shows_its_last_rounds(con):
    page = agents_page(con, "num", limit=5, max_cells=10)
    assert (page["rounds"], page["rounds_total"]) == ([2, 3], 3)
    assert {c["round"] for a in page["agents"] for c in a["rounds"]} == {2, 3}


def test_categorical_columns_and_an_unknown_run(con):
    page = agents_page(con, "cat")
    assert page["columns"] == ["choice", "why"] and page["agents"][5]["rounds"][0]["values"] == {
        "choice": "abstain", "why": "because"}
    assert page["agents"][0]["profile"] is None
    with pytest.raises(AnalysisError, match="not recorded"):
        agents_page(con, "nope")


def test_the_last_closed_rounds_histogram_uses_the_reports_bins(con):
    d = round_distribution(con, "num", bins=10)
    assert (d["round"], d["closed"], d["kind"], d["n"]) == (2, 2, "numeric", 9)
    assert d["summary"] == {"mean": 47.0, "target": 30.0}
    a, b, bins = histogram_bins(0.0, 100.0, integer=False, bins=10)
    assert d["edges"][0] == a and d["edges"][-1] == b and len(d["counts"]) == bins == 10
    assert sum(d["counts"]) == 9 and d["counts"][0] == 1 and d["counts"][7] == 0  # agent 7 was invalid
    one = round_distribution(con, "num", round=3, bins=5)
    assert (one["n"], one["summary"], sum(one["counts"]), len(one["counts"])) == (5, {}, 5, 5)


def test_a_categorical_round_is_each_options_share(con):
    d = round_distribution(con, "cat")
    assert (d["kind"], d["options"], d["counts"], d["n"], d["leader"]) == (
        "categorical", ["yes", "no", "abstain"], [3, 2, 1], 6, "yes")
    assert d["shares"] == [0.5, pytest.approx(1 / 3), pytest.approx(1 / 6)]


def test_no_round_closed_yet(con):
    _run(con, "fresh", NUMERIC, 3)
    d = round_distribution(con, "fresh")
    assert d["round"] is None and d["n"] == 0 and "edges" not in d


@pytest.mark.skipif(os.environ.get("POPULACE_BENCH") != "1", reason="timing: POPULACE_BENCH=1")
def test_a_million_agents(tmp_path):
    """Prints the figures quoted in populace.analysis.live's docstring."""
    n = 1_000_000
    c = duckdb.connect(str(tmp_path / "big.duckdb"))
    c.execute(SCHEMA)
    _create(c, NUMERIC)
    _run(c, "big", NUMERIC, n)
    for r in (1, 2, 3):  # as the recorder writes them: a round's batches one after the other
        c.execute("INSERT INTO picks SELECT 'big', ?, range, (hash(range + ?) % 10000) / 100.0, true, "
                  "'I pick ' || (range % 97) || ' because the others will pick less', 900.0, NULL FROM range(?)",
                  [r, r, n])
        c.execute("INSERT INTO pick_rounds (run_id, round, n, n_valid, mean, target) VALUES ('big', ?, ?, ?, 50, 33)",
                  [r, n, n])
    c.execute("INSERT INTO agent_profiles SELECT 'big', range, range, "
              "json_object('education', ['high school', 'bachelor''s', 'master''s'][range % 3 + 1], "
              "'age', 18 + range % 60, 'gender', ['female', 'male'][range % 2 + 1]), "
              "json_object('name', ['Maria Lopez', 'John Smith', 'Sara Chess', 'Ann Lee'][range % 4 + 1], "
              "'description', 'A person who likes ' || ['chess', 'tennis', 'music', 'maps', 'bread'][range % 5 + 1] "
              "|| ' and lives in town number ' || range) FROM range(?)", [n])
    c.execute("CHECKPOINT")

    def timed(f, *args, **kw):
        f(*args, **kw)  # warm
        t0 = time.perf_counter()
        for _ in range(3):
            out = f(*args, **kw)
        return (time.perf_counter() - t0) / 3, out

    figures = {}
    figures["page 0"], p = timed(agents_page, c, "big", limit=50)
    assert p["total"] == n and len(p["agents"]) == 50 and len(p["agents"][0]["rounds"]) == 3
    figures["page 10,000"], p = timed(agents_page, c, "big", offset=500_000, limit=50)
    assert p["agents"][0]["agent_id"] == 500_000
    figures["id"], p = timed(agents_page, c, "big", search="765432")
    assert p["agents"][0]["agent_id"] == 765432
    figures["two words"], p = timed(agents_page, c, "big", search="chess master's")
    assert p["total"] > 0 and len(p["agents"]) == 50
    figures["histogram"], d = timed(round_distribution, c, "big")
    assert d["n"] == n
    print({k: f"{v * 1000:.1f} ms" for k, v in figures.items()})
    c.close()
