"""One path for every row (issue 40, item 4): a local run reaches DuckDB as the wire batches its shares
emitted — the very `OutcomeBatch` an agent-host publishes (populace.sdk.outcome_wire) — through the
recorder's own ingest, and its tables then hold exactly the rows `run_local` returns as columns:
outcomes, a scene's acts and lines, posts, edge edits (in the order they applied), who saw what,
a prototype run's audits and drawn rows."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import duckdb
import pytest

from populace.client.prepare import load_scenario_data, parse_config, prepare
from populace.core.contracts import LOCAL_HOST, OutcomeBatch
from populace.graph.serial import loads
from populace.population.cast import cast_from_jsonl
from populace.sdk.local import LocalResult, run_local
from populace.sdk.outcome_wire import ACT_PLATFORM, outcome_batch
from populace.sdk.play import OutcomeRows
from populace.store.local_runs import record_local

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# (scenario, overrides, hosts): scenes; posts, edges and shown; a prototype run's audits and draws
CASES = {
    "bargaining": ("bargaining.yaml", {"agents": 40, "rounds": 2}, 2),
    "feed": ("feed.yaml", {"agents": 300, "rounds": 3}, 2),
    "prototypes": ("prototypes.yaml", {"agents": 500, "rounds": 2}, 2),
}


def played(case: str, tmp_path: Path) -> tuple[LocalResult, Path]:
    scenario, overrides, hosts = CASES[case]
    path = EXAMPLES / scenario
    data, _ = load_scenario_data(path)
    prepared = prepare(parse_config({**data, **overrides}), base=path.parent, agents_given=True)
    cast = cast_from_jsonl(prepared.personas) if prepared.personas is not None else None
    graph = loads(prepared.graph) if prepared.graph is not None else None
    result = asyncio.run(run_local(prepared.resolved, run_id=case, cast=cast, graph=graph, hosts=hosts,
                                   keep_states=False))
    db = tmp_path / "local.duckdb"
    recorded = record_local(db, run_id=case, config=prepared.config, tables=result.tables, batches=result.batches,
                            rounds=result.rounds, personas=prepared.personas, profile=result.profile,
                            prototypes=result.prototype_reports, population=result.population)
    assert recorded == len(result.outcomes["agent_id"])
    return result, db


def stored(con: duckdb.DuckDBPyConnection, table: str, columns: list[str], order: str) -> dict[str, list]:
    rows = con.execute(f'SELECT {", ".join(columns)} FROM "{table}" ORDER BY {order}').fetchall()
    return {c: [r[i] for r in rows] for i, c in enumerate(columns)}


def as_returned(db_values: list, local_values: list) -> list:
    """A JSON column's text read back as the values run_local gave."""
    return [json.loads(d) if isinstance(d, str) and not isinstance(v, str) else d
            for d, v in zip(db_values, local_values, strict=True)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_local_runs_tables_hold_exactly_the_rows_it_returned(case, tmp_path):
    result, db = played(case, tmp_path)
    t = result.tables
    tables = [("outcomes", t.outcomes, "round, agent_id"), ("audits", "audits", "round, agent_id"),
              ("acts", t.acts, "round, group_id, seq"), ("transcripts", "transcripts", "round, group_id, seq"),
              ("posts", "posts", "round, agent_id"), ("shown", "shown", "round, agent_id"),
              ("edges", "edges", "round, follower, rowid")]  # an agent's edits in the order they applied
    compared = []
    with duckdb.connect(str(db), read_only=True) as con:
        for attr, table, order in tables:
            local = getattr(result, attr)
            if not local or not local[next(iter(local))]:
                continue
            got = stored(con, table, list(local), order)
            for column, values in local.items():
                assert as_returned(got[column], values) == values, (table, column)
            compared.append(attr)
    expected = {"bargaining": ["outcomes", "acts", "transcripts"], "feed": ["outcomes", "posts", "shown", "edges"],
                "prototypes": ["outcomes", "audits"]}[case]
    assert compared == expected
    if case == "prototypes":  # the store drew the others' rows from the representatives' batches, as on the fleet
        assert set(result.outcomes["source"]) == {"llm", "prototype"}
        assert all(not b.audit or b.prototypes for b in result.batches)


def test_the_kept_batches_are_one_hosts_numbered_in_each_round_and_read_as_the_wire_reads_them(tmp_path):
    result, _ = played("bargaining", tmp_path)
    by_round: dict[int, list[int]] = {}
    for b in result.batches:
        assert (b.run_id, b.host_id, b.epoch) == ("bargaining", LOCAL_HOST, 0)
        by_round.setdefault(b.round, []).append(b.seq)
        # what the recorder would decode off the wire is this very batch
        assert OutcomeBatch.model_validate_json(b.model_dump_json()).model_dump() == b.model_dump()
    assert by_round == {r: list(range(len(seqs))) for r, seqs in by_round.items()}
    assert sorted(by_round) == [1, 2]


def test_an_engine_batch_becomes_the_wire_batch_around_its_own_lists():
    acts = {"group_id": [7], "seq": [0], "agent_id": [3], "phase": ["offer"], "give": [4], "valid": [True],
            "raw": ["{}"], "latency_ms": [2.0], "error": [None]}
    rows = OutcomeRows(seq=5, agent_ids=[3, 4], columns={"kept": [6, 4]}, valid=[True, True], raws=["a", "b"],
                       latency_ms=[1.0, 1.5], errors=[None, None], group_ids=[7, 7], acts=acts,
                       lines={"group_id": [7], "seq": [0], "speaker": [3], "text": ["hi"], "fields": [None]})
    wire = outcome_batch(rows, run_id="r", round_=2, host_id="h", epoch=1)
    assert (wire.run_id, wire.round, wire.host_id, wire.epoch, wire.seq) == ("r", 2, "h", 1, 5)
    assert wire.agent_ids is rows.agent_ids and wire.raws is rows.raws  # not copied: the hot path
    assert wire.acts is not None and wire.acts.columns == {"give": [4]}  # the simulation's Act columns apart
    assert {k: getattr(wire.acts, k) for k in ACT_PLATFORM} == {k: acts[k] for k in ACT_PLATFORM}
    assert wire.lines is not None and wire.lines.text == ["hi"]
    assert outcome_batch(rows, run_id="r", round_=2, host_id="h", seq=0).seq == 0


def test_a_batch_of_another_run_or_host_is_refused_naming_it(tmp_path):
    result, _ = played("bargaining", tmp_path)
    forged = result.batches[0].model_copy(update={"host_id": "host-1"})
    with pytest.raises(ValueError, match="batches: round 1's batch 0 is run 'bargaining''s from host 'host-1'"):
        record_local(tmp_path / "other.duckdb", run_id="bargaining", config=result.config, tables=result.tables,
                     batches=[forged], rounds={})
    with pytest.raises(ValueError, match="not a local run 'other''s"):
        record_local(tmp_path / "other.duckdb", run_id="other", config=result.config, tables=result.tables,
                     batches=result.batches[:1], rounds={})
