"""End to end, prototypes (issue 39) on real processes: examples/prototypes.yaml plays on a stack
of two agent-hosts with its representatives' own answers and everyone else's drawn answers in
the outcome table (`source` llm / prototype), its audits in table `audits`, its model calls
(audits included) at most 10% of its outcomes, and every row, audit and divergence equal to the
run in one process; the guard's raised shares travel with the round opens; a fork after round 1
plays the parent's rounds again exactly; `run --estimate` counts the representatives and audits."""

from __future__ import annotations

import asyncio
from pathlib import Path

import duckdb
import pytest

from populace.client.prepare import prepare_file, prepare_fork
from populace.client.run import play
from populace.core import bus
from populace.core.contracts import Restore
from populace.sdk.local import run_local

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).parents[2] / "examples" / "prototypes.yaml"
DROP = ("run_id", "latency_ms")


@pytest.fixture(scope="module")
def stack(stacks):
    return stacks(hosts=2, env={"POPULACE_STORAGE": "memory"}, one_process=True)


def played(stack, prepared, fork: Restore | None = None):
    async def go():
        nc = await bus.connect(stack.url, "e2e-prototypes")
        try:
            return await play(nc, prepared.config, manifest=prepared.manifest, stall_s=120, fork=fork,
                              personas=prepared.personas)
        finally:
            await nc.close()

    out = asyncio.run(go())
    assert out.status == "completed", out.reason
    return out


def table(db: str, sql: str, run_id: str) -> list[dict]:
    with duckdb.connect(db, read_only=True) as con:
        cur = con.execute(sql, [run_id])
        names = [d[0] for d in cur.description]
        return [{k: v for k, v in zip(names, row) if k not in DROP} for row in cur.fetchall()]


def outcomes(db: str, run_id: str) -> list[dict]:
    return table(db, "SELECT * FROM guesses WHERE run_id = ? ORDER BY round, agent_id", run_id)


def audits(db: str, run_id: str) -> list[dict]:
    return table(db, "SELECT round, agent_id, prototype, value, valid, raw, error FROM audits WHERE run_id = ? "
                     "ORDER BY round, agent_id", run_id)


def reports(db: str, run_id: str) -> list[dict]:
    return table(db, "SELECT * FROM prototype_rounds WHERE run_id = ? ORDER BY round, prototype", run_id)


def local_rows(columns: dict[str, list]) -> list[dict]:
    keys = [k for k in columns if k not in DROP]
    return [dict(zip(keys, row)) for row in zip(*(columns[k] for k in keys))]


def test_the_example_plays_on_the_fleet_as_in_one_process_and_forks_exactly(stack):
    prepared = prepare_file(EXAMPLE)
    out = played(stack, prepared)
    rows = outcomes(stack.db, out.run_id)
    assert len(rows) == 2000 * 3
    sources = {r["source"] for r in rows}
    assert sources == {"llm", "prototype"}
    drawn = [r for r in rows if r["source"] == "prototype"]
    assert all(r["drawn_from"] is not None and r["valid"] for r in drawn)
    own = {(r["round"], r["agent_id"]): r for r in rows if r["source"] == "llm"}
    # a drawn row is its representative's answer, of the same round and prototype
    assert all(own[r["round"], r["drawn_from"]]["value"] == r["value"]
               and own[r["round"], r["drawn_from"]]["prototype"] == r["prototype"] for r in drawn)
    audited = audits(stack.db, out.run_id)
    assert len(audited) == 5 * 12 * 3 and all(a["valid"] for a in audited)
    with duckdb.connect(stack.db, read_only=True) as con:
        (calls,) = con.execute("SELECT sum(llm_calls) FROM rounds WHERE run_id = ?", [out.run_id]).fetchone()
    assert calls == len(own) + len(audited) and calls <= 0.10 * len(rows)

    # the same run in one process: every row, audit and divergence
    local = asyncio.run(run_local(prepared.resolved, cast=prepared.cast))
    assert rows == local_rows(local.outcomes)
    assert audited == [{k: a[k] for k in ("round", "agent_id", "prototype", "value", "valid", "raw", "error")}
                       for a in local_rows(local.audits)]
    fleet_reports = reports(stack.db, out.run_id)
    assert [(r["round"], r["prototype"], r["divergence"], r["ci_low"], r["ci_high"]) for r in fleet_reports] == [
        (n, s.label, s.divergence, s.ci_low, s.ci_high) for n, rep in local.prototype_reports.items()
        for s in rep.stats]

    # a fork after round 1 with nothing changed plays rounds 2 and 3 again, draws and audits included
    forked = prepare_fork(prepared.config, 1, {}, prepared.manifest, out.run_id)
    again = played(stack, forked, Restore(run_id=out.run_id, round=1))
    assert outcomes(stack.db, again.run_id) == [r for r in rows if r["round"] > 1]
    assert audits(stack.db, again.run_id) == [a for a in audited if a["round"] > 1]
    assert reports(stack.db, again.run_id) == [r for r in fleet_reports if r["round"] > 1]


def test_the_guard_raises_a_shares_representatives_from_the_next_round_on_the_fleet(stack, tmp_path):
    scenario = tmp_path / "guard.yaml"
    scenario.write_text("simulation: ratio-game\nagents: 400\nrounds: 3\nseed: 6\n"
                        "prototypes: {share: 0.05, audits: 20, tolerance: 0.5, raise_by: 2}\n")
    prepared = prepare_file(scenario)
    out = played(stack, prepared)
    got = reports(stack.db, out.run_id)
    local = asyncio.run(run_local(prepared.resolved))
    assert [(r["round"], r["share"], r["representatives"], r["breach"], r["next_share"]) for r in got] == [
        (n, s.share, s.representatives, s.breach, s.next_share) for n, rep in local.prototype_reports.items()
        for s in rep.stats]
    # over the tolerance after rounds 1 and 2 (20 representatives copied by 380 are further than 0.5 from
    # the audits): 20, then 40, then 80 representatives
    assert [(r["breach"], r["representatives"]) for r in got] == [(True, 20), (True, 40), (False, 80)]
    assert outcomes(stack.db, out.run_id) == local_rows(local.outcomes)




def test_the_estimate_of_a_prototype_run_counts_its_representatives_and_audits(stack, cli):
    # 5 levels of 400 agents: 16 representatives and 12 audits each call per round, 3 rounds; the
    # pilot plays without prototypes (every pilot agent calls) to measure a call
    r = cli("run", str(EXAMPLE), "--estimate", "--nats", stack.url, "--no-progress", env={"COLUMNS": "250"})
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "20 of 2,000 agents, round 1, model dummy: 20 LLM calls" in out, out
    assert "prototypes: 80 representatives and 60 audits call the model each round (7.0% of the agents" in out, out
    assert "expected for 2,000 agents × 3 rounds: 420 LLM calls" in out, out
