"""End to end, steering a run on real processes: cancel stops a run at once and keeps what was
recorded; resume continues it from its last completed round and, on the dummy model, ends
exactly as an uninterrupted run (every agent's value, every round's summary); a fork starts
from a parent's state after a round (unchanged, it replays the parent's later rounds; with a
change, it records the parent, the round and the change); the CLI refuses what cannot apply
with a message and detaches on Ctrl-C, telling how to follow the run."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time

import duckdb
import pytest
import yaml

from populace.analysis import fork_table, render_report
from populace.client.prepare import prepare, prepare_fork
from populace.client.run import cancel, new_run_id, play, resume, run_state
from populace.client.stack import Stack
from populace.core import bus
from populace.core.contracts import Restore, RoundOpen, RunConfig

pytestmark = pytest.mark.e2e

AGENTS, ROUNDS = 2000, 5
BASE = {"agents": AGENTS, "rounds": ROUNDS, "seed": 3, "model": {"latency_s": 0.4, "seed": 21}}


@pytest.fixture(scope="module")
def stack(stacks):
    """The services in one process: what is steered is the run, over the bus (the process killed
    in a test is the CLI's, never a service's)."""
    return stacks(hosts=2, env={"POPULACE_STORAGE": "memory"}, one_process=True)


def rows(db: str, table: str, run_id: str, order: str, drop: tuple[str, ...]) -> list[dict]:
    with duckdb.connect(db, read_only=True) as con:
        cur = con.execute(f'SELECT * FROM "{table}" WHERE run_id = ? ORDER BY {order}', [run_id])
        names = [d[0] for d in cur.description]
        return [{k: v for k, v in zip(names, r) if k not in drop} for r in cur.fetchall()]


def guesses(db: str, run_id: str) -> list[dict]:
    return rows(db, "guesses", run_id, "round, agent_id", ("run_id", "latency_ms"))


def summaries(db: str, run_id: str) -> list[dict]:
    return rows(db, "rounds", run_id, "round", ("run_id", "closed_at"))


def status_of(db: str, run_id: str) -> tuple:
    with duckdb.connect(db, read_only=True) as con:
        return con.execute("SELECT status, reason FROM runs WHERE run_id = ?", [run_id]).fetchone()


async def _connected(stack: Stack, work):
    nc = await bus.connect(stack.url, "e2e-steer")
    try:
        return await work(nc)
    finally:
        await nc.close()


def uninterrupted(stack: Stack) -> str:
    prepared = prepare(RunConfig.model_validate(BASE))

    async def go(nc):
        return await play(nc, prepared.config, manifest=prepared.manifest, stall_s=120)

    out = asyncio.run(_connected(stack, go))
    assert out.status == "completed", out.reason
    return out.run_id


@pytest.fixture(scope="module")
def reference(stack) -> str:
    return uninterrupted(stack)


def cancel_in_round(stack: Stack, round_: int) -> str:
    """Start a run and cancel it while `round_` is in play; returns its id."""
    prepared = prepare(RunConfig.model_validate(BASE))
    rid = new_run_id()

    async def go(nc):
        async def on_event(kind, model):
            if isinstance(model, RoundOpen) and model.round == round_:
                await cancel(nc, rid, "enough for now")

        pending: list[asyncio.Task] = []
        out = await play(nc, prepared.config, run_id=rid, manifest=prepared.manifest, stall_s=120,
                         on_event=lambda k, m: pending.append(asyncio.ensure_future(on_event(k, m))))
        await asyncio.gather(*pending)
        return out, await run_state(nc, rid)

    out, state = asyncio.run(_connected(stack, go))
    assert out.status == "cancelled" and out.reason == "enough for now"
    assert state.status == "cancelled" and state.round == round_ - 1  # the last completed round
    return rid


def test_cancel_keeps_what_was_recorded_and_resume_ends_as_if_never_stopped(stack, reference):
    rid = cancel_in_round(stack, 3)
    assert status_of(stack.db, rid) == ("cancelled", "enough for now")
    kept = summaries(stack.db, rid)
    assert [r["round"] for r in kept] == [1, 2]  # the round in play is dropped
    assert kept == summaries(stack.db, reference)[:2]

    async def go(nc):
        return await resume(nc, rid, stall_s=120)

    out = asyncio.run(_connected(stack, go))
    assert out.status == "completed", out.reason
    assert [r.round for r in out.results] == [3, 4, 5]
    assert out.recorded is not None and out.recorded.outcomes == AGENTS * ROUNDS
    assert status_of(stack.db, rid) == ("completed", None)
    # exactly one outcome per agent per round, and the very values of the undisturbed run
    got = guesses(stack.db, rid)
    assert [(g["round"], g["agent_id"]) for g in got] == [(n, a) for n in range(1, ROUNDS + 1) for a in range(AGENTS)]
    assert got == guesses(stack.db, reference)
    assert summaries(stack.db, rid) == summaries(stack.db, reference)


def test_a_run_cancelled_in_its_first_round_keeps_no_round(stack):
    rid = cancel_in_round(stack, 1)
    assert summaries(stack.db, rid) == []

    async def go(nc):
        state = await run_state(nc, rid)
        return state

    state = asyncio.run(_connected(stack, go))
    assert state.status == "cancelled" and state.round == 0 and state.epoch == 0


def test_a_fork_unchanged_replays_its_parents_later_rounds(stack, reference):
    async def parent_config(nc):
        return (await run_state(nc, reference)).config

    parent = asyncio.run(_connected(stack, parent_config))
    prepared = prepare_fork(parent, 2, {}, None, reference)

    async def go(nc):
        return await play(nc, prepared.config, manifest=prepared.manifest, stall_s=120,
                          fork=Restore(run_id=reference, round=2))

    out = asyncio.run(_connected(stack, go))
    assert out.status == "completed", out.reason
    assert [r.round for r in out.results] == [3, 4, 5]
    # the agents remembered rounds 1-2 and the environment's history continued: same answers
    assert summaries(stack.db, out.run_id) == summaries(stack.db, reference)[2:]
    assert guesses(stack.db, out.run_id) == [g for g in guesses(stack.db, reference) if g["round"] > 2]


def test_a_fork_with_a_change_records_its_parent_and_plays_differently(stack, reference, cli):
    async def parent_config(nc):
        return (await run_state(nc, reference)).config

    parent = asyncio.run(_connected(stack, parent_config))
    prepared = prepare_fork(parent, 3, {"game": {"ratio": "1/2"}}, None, reference)
    assert prepared.manifest["fork"] == {"parent": reference, "after_round": 3, "changes": {"game": {"ratio": "1/2"}}}

    async def go(nc):
        return await play(nc, prepared.config, manifest=prepared.manifest, stall_s=120,
                          fork=Restore(run_id=reference, round=3))

    out = asyncio.run(_connected(stack, go))
    assert out.status == "completed", out.reason
    assert [r.round for r in out.results] == [4, 5]
    forked, before = summaries(stack.db, out.run_id), summaries(stack.db, reference)[3:]
    assert [r["mean"] for r in forked] == [r["mean"] for r in before]  # same answers (dummy model) …
    assert all(abs(f["target"] - f["mean"] / 2) < 1e-9 for f in forked)  # … judged by the new ratio
    with duckdb.connect(stack.db, read_only=True) as con:
        manifest = con.execute("SELECT manifest_json->>'$.fork.parent' FROM runs WHERE run_id = ?",
                               [out.run_id]).fetchone()[0]
        side = fork_table(con, out.run_id)
        page = render_report(con, out.run_id)
    assert manifest == reference
    # results and the report read the fork beside its parent: shared rounds, then both
    assert (side["parent"], side["after_round"], side["changes"]) == (reference, 3, {"game": {"ratio": "1/2"}})
    assert [(r["round"], r["shared"]) for r in side["rounds"]] == [(n, n <= 3) for n in range(1, ROUNDS + 1)]
    assert all(r["difference"] == 0 for r in side["rounds"])  # the same answers, judged differently
    assert "Fork beside its parent" in page and 'aria-label="The fork and its parent per round"' in page
    r = cli("results", out.run_id, "--db", stack.db, env=WIDE)
    assert r.returncode == 0, r.stderr
    assert f"of {reference} after round 3, changed: game.ratio=1/2" in r.stdout
    assert r.stdout.count("(shared)") == 3 * 2  # the mean and the target, rounds 1-3
    # rounds 4-5: round, parent mean, fork mean, difference, parent target, fork target (the recorded rounds)
    played = [[c.strip() for c in line.strip("│").split("│")] for line in r.stdout.splitlines()
              if line.startswith("│") and "(shared)" not in line and line.count("│") == 7]
    parent_rounds = summaries(stack.db, reference)
    assert [row[0] for row in played[-2:]] == ["4", "5"], r.stdout
    for row, p, f in zip(played[-2:], parent_rounds[3:], forked, strict=True):
        assert row[1:] == [f"{p['mean']:.2f}", f"{f['mean']:.2f}", "0.00", f"{p['target']:.2f}", f"{f['target']:.2f}"]


def test_a_fork_of_a_round_not_played_fails_with_the_reason(stack, reference):
    async def go(nc):
        config = (await run_state(nc, reference)).config
        return await play(nc, config, stall_s=60, fork=Restore(run_id=reference, round=ROUNDS + 3))

    out = asyncio.run(_connected(stack, go))
    assert out.status == "failed"
    assert out.reason == f"cannot fork: run {reference} has completed {ROUNDS} rounds, not {ROUNDS + 3}"


# -- the CLI ---------------------------------------------------------------------------------
# In process (the `cli` fixture, typer's runner on the real app) unless the process boundary is
# the point (Ctrl-C): the commands' answers come from the stack, not from a console script.
WIDE = {"COLUMNS": "200"}


def test_cli_refuses_what_cannot_apply(stack, reference, cli):
    """In process (the `cli` fixture): the refusals are the stack's answers; no process boundary is under test."""
    r = cli("cancel", "no-such-run", "--nats", stack.url, env=WIDE)
    assert r.returncode == 2 and "run 'no-such-run' is not known on this stack" in r.stderr
    r = cli("cancel", reference, "--nats", stack.url, env=WIDE)
    assert r.returncode == 2 and f"run {reference} is done (5 of 5 rounds completed): nothing to cancel" in r.stderr
    r = cli("resume", reference, "--nats", stack.url, env=WIDE)
    assert r.returncode == 2 and "only a failed, cancelled or paused run resumes" in r.stderr
    r = cli("fork", reference, "--from-round", "9", "--nats", stack.url, env=WIDE)
    assert r.returncode == 2 and "--from-round: run" in r.stderr and "has completed 5 round(s)" in r.stderr
    r = cli("fork", reference, "--from-round", "5", "--nats", stack.url, env=WIDE)
    assert r.returncode == 2 and "rounds: the fork continues after round 5" in r.stderr
    r = cli("fork", reference, "--from-round", "2", "--set", "agents=10", "--nats", stack.url, env=WIDE)
    assert r.returncode == 2 and "agents: a fork keeps its parent's agents" in r.stderr
    r = cli("fork", reference, "--from-round", "2", "--set", "game.ratio=lots", "--nats", stack.url, env=WIDE)
    assert r.returncode == 2 and "game.ratio" in r.stderr


def test_cli_fork_plays_and_says_what_changed(stack, reference, cli):
    r = cli("fork", reference, "--from-round", "4", "--set", "game.offset=5", "--nats", stack.url,
            "--no-progress", env=WIDE)
    assert r.returncode == 0, r.stderr
    assert f"of {reference} after round 4, changed: " in r.stderr and '"offset": 5' in r.stderr
    assert "(completed)" in r.stdout


def test_ctrl_c_in_run_detaches_and_follow_sees_the_run_to_its_end(stack, tmp_path, cli):
    scenario = tmp_path / "s.yaml"
    # long enough (4 rounds of 3 s) that a loaded machine still finds it running when Ctrl-C comes
    scenario.write_text("agents: 500\nrounds: 4\nmodel:\n  latency_s: 3.0\n")
    # SIGINT back to its default in the child: a suite started in a background job (`cmd &`, nohup)
    # ignores SIGINT, the child would inherit the ignore, and Ctrl-C would never reach it
    proc = subprocess.Popen([sys.executable, "-m", "populace.cli", "run", str(scenario), "--nats", stack.url,
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # the run's id comes first, before any round: watch that one run (reading every run of
        # the module's stack in turn could take the whole run under load, and miss it)
        first = proc.stderr.readline()
        named = re.match(r"run (\S+): ", first)
        assert named, first + proc.stderr.read()
        deadline = time.monotonic() + 60

        async def started(nc):
            while time.monotonic() < deadline:
                state = await run_state(nc, named.group(1))
                if state and state.status == "running" and state.config.agents == 500:
                    return named.group(1)
                await asyncio.sleep(0.1)
            raise AssertionError("the run did not start")

        rid = asyncio.run(_connected(stack, started))
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        err = first + err
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert re.search(rf"detached: run {rid} goes on", err), err
    assert f"populace follow {rid} --nats {stack.url}" in err
    r = cli("follow", rid, "--nats", stack.url, "--no-progress", env=WIDE)
    assert r.returncode == 0, r.stderr
    assert f"run {rid} (completed)" in r.stdout or f"run {rid} is done (4 of 4 rounds completed)" in r.stdout
    r = cli("follow", rid, "--nats", stack.url, env=WIDE)
    assert r.returncode == 0 and f"run {rid} is done (4 of 4 rounds completed)" in r.stdout


def test_a_run_pauses_on_its_budget_and_resume_with_a_larger_one_ends_as_if_never_stopped(stack, reference,
                                                                                           tmp_path, cli):
    # 2,000 answered calls a round: after round 2, 4,000 of 4,500 are used and round 3 would
    # need about 2,000 more, so the run pauses there
    scenario = tmp_path / "budget.yaml"
    scenario.write_text(yaml.safe_dump({**BASE, "budget": {"llm_calls": 4500}}))
    r = cli("run", str(scenario), "--nats", stack.url, "--no-progress", env=WIDE)
    assert r.returncode == 1, r.stderr
    rid = re.search(r"run (\S+) paused: budget: 4,000 of 4,500 LLM calls used, and the next round needs "
                    r"about 2,000 more", r.stderr.replace("\n", " ")).group(1)
    assert f"populace resume {rid} --budget-" in r.stderr.replace("\n", " ")
    state = asyncio.run(_connected(stack, lambda nc: run_state(nc, rid)))
    assert (state.status, state.round, state.used.llm_calls) == ("paused", 2, 4000)
    assert [s["round"] for s in summaries(stack.db, rid)] == [1, 2]

    r = cli("resume", rid, "--nats", stack.url, "--no-progress", env=WIDE)  # the same budget: refused
    assert r.returncode != 0 and "give a larger budget" in r.stderr.replace("\n", " ")
    r = cli("resume", rid, "--budget-calls", "20000", "--nats", stack.url, "--no-progress", env=WIDE)
    assert r.returncode == 0, r.stderr
    assert f"run {rid} (completed)" in r.stdout
    state = asyncio.run(_connected(stack, lambda nc: run_state(nc, rid)))
    assert state.used.llm_calls == AGENTS * ROUNDS and state.config.budget.llm_calls == 20000
    assert guesses(stack.db, rid) == guesses(stack.db, reference)
    assert summaries(stack.db, rid) == summaries(stack.db, reference)
