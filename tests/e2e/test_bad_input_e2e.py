"""Issues 23 and 37, bad input, on real processes (2 agent-hosts): a view that raises, an edge edit of
a kind the simulation does not declare, a world column of the wrong type, a claim on a cell that does
not exist and a broken invariant each pause the run in round 2 with the simulation, the field
and the round named, as the simulation's bug; round 1 stays recorded; once the simulation is fixed
(here: the file naming the bug is deleted, as every service reads it at each call) `populace
resume` plays on, and every table equals an undisturbed run's in one process."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import duckdb
import pytest
from locked_reads import read_recorded

from populace.client.prepare import prepare
from populace.client.run import play, resume, run_state
from populace.core import bus
from populace.core.contracts import RunConfig
from populace.sdk.local import run_local

pytestmark = pytest.mark.e2e

SIMS = Path(__file__).with_name("sims")  # bad_input_sims: importable by the services through PYTHONPATH
sys.path.insert(0, str(SIMS))  # … and by this process, which prepares the runs and plays the reference
CONFIG = {"simulation": "bad_input_sims:Ledger", "agents": 60, "rounds": 4, "seed": 5, "model": {"latency_s": 0.0}}
DROP = ("run_id", "latency_ms", "closed_at", "prompt_tokens", "completion_tokens")


@pytest.fixture(scope="module")
def bug_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bad-input") / "bug"


@pytest.fixture(scope="module")
def stack(stacks, bug_file):
    """Two hosts in one process with the other services: no service is killed or measured alone."""
    return stacks(hosts=2, env={"POPULACE_STORAGE": "memory", "PYTHONPATH": str(SIMS),
                                "BAD_INPUT_BUG_FILE": str(bug_file)}, one_process=True, timeout=120)


@pytest.fixture(scope="module")
def undisturbed():
    return asyncio.run(run_local(prepare(RunConfig.model_validate(CONFIG)).resolved, hosts=2))


def table(db: str, name: str, run_id: str, order: str) -> list[dict]:
    """The run's rows. A host's outcome batch of the round the pause cut short can reach the
    recorder after the run is recorded: a reader meeting its lock tries again (locked_reads)."""
    def rows_of(con: duckdb.DuckDBPyConnection) -> list[dict]:
        cur = con.execute(f'SELECT * FROM "{name}" WHERE run_id = ? ORDER BY {order}', [run_id])
        names = [d[0] for d in cur.description]
        return [{k: v for k, v in zip(names, row) if k not in DROP} for row in cur.fetchall()]

    return read_recorded(db, rows_of)


def local_rows(columns: dict[str, list]) -> list[dict]:
    keys = [k for k in columns if k not in DROP]
    return [dict(zip(keys, r)) for r in zip(*(columns[k] for k in keys))]


@pytest.mark.parametrize(("bug", "named"), [
    ("view", "simulation 'ledger': BoardEnv.view raised in round 2 for agent 7: KeyError: 'no such post for agent 7'"),
    ("edge_kind", "simulation 'ledger', round 2, agent 7: outcome.edits[0]: edge kind 'like' is not declared "
                  "(follow)"),
    ("world_type", "simulation 'ledger': its world after round 2 is refused: Board.score: float64 values do not fit "
                   "a int32 column"),  # refused in the environment service, which pauses the run (not fails it)
    # the world's rules, enforced where the round is decided (issue 37)
    ("claim", "simulation 'ledger': round 2: claims: agent 7 claims cell 21, which does not exist (cells are 0..15)"),
    ("invariant", "simulation 'ledger': invariant 'no score below zero' is broken after round 2: [7, 11]"),
    ("shown_item", "simulation 'ledger', round 2, agent 7: shown.items: 9999 is not in the round's Board.cells"),
], ids=["view", "edge_kind", "world_type", "claim", "invariant", "shown_item"])
def test_bad_input_pauses_the_fleet_run_and_a_resume_after_the_fix_is_exact(stack, bug_file, undisturbed, bug, named):
    prepared = prepare(RunConfig.model_validate(CONFIG))
    bug_file.write_text(bug)

    async def until_paused():
        nc = await bus.connect(stack.url, "e2e-bad-input")
        try:
            out = await play(nc, prepared.config, manifest=prepared.manifest, stall_s=120)
            return out, await run_state(nc, out.run_id)
        finally:
            await nc.close()

    try:
        out, state = asyncio.run(until_paused())
    finally:
        bug_file.unlink()  # the fix
    assert out.status == "paused", out.reason
    assert named in out.reason and "fix the simulation, then `populace resume" in out.reason, out.reason
    assert state.status == "paused" and state.round == 1
    t = undisturbed.tables
    assert [r["round"] for r in table(stack.db, t.rounds, out.run_id, "round")] == [1]  # round 1 stays recorded

    async def resumed():
        nc = await bus.connect(stack.url, "e2e-bad-input-resume")
        try:
            return await asyncio.wait_for(resume(nc, out.run_id, stall_s=120), timeout=240)
        finally:
            await nc.close()

    done = asyncio.run(resumed())
    assert done.status == "completed", done.reason
    assert table(stack.db, t.outcomes, out.run_id, "round, agent_id") == local_rows(undisturbed.outcomes)
    assert table(stack.db, t.rounds, out.run_id, "round") == local_rows(undisturbed.rounds)
    assert table(stack.db, "edges", out.run_id, "round, follower, author") == local_rows(undisturbed.edges)
    assert len(undisturbed.edges["follower"]) == 60 * 4  # every agent follows another each round
    assert table(stack.db, "shown", out.run_id, "round, agent_id") == local_rows(undisturbed.shown)
    assert len(undisturbed.shown["agent_id"]) == 60 * 4  # what each agent was shown, each round
