"""Processes killed at moments nobody chose: each trial plays a run on a live stack and kills one
of its processes at a random moment (SIGKILL or SIGTERM, restarted after a random pause), or
cancels the run while the orchestrator is killed at about the same moment and then resumes it;
every trial's DuckDB rows must equal an undisturbed run's. Seeded: a trial that goes wrong is
played again with the same seed.

    uv run python bench/chaos.py --trials 20 --seed 1 --mode kill
    uv run python bench/chaos.py --trials 10 --seed 7 --mode cancel

The fault matrix (tests/e2e/test_faults_e2e.py) kills each process at one chosen moment, in
CI; this explores the others, outside it (each trial is a few seconds, a batch is minutes).
One stack (file storage, 2 agent-hosts, the fault matrix's fast heartbeats), a reference run
first. Exits 1 if a trial is not exact."""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import duckdb

from populace.client.prepare import prepare
from populace.client.run import cancel, new_run_id, play, resume
from populace.client.stack import Stack
from populace.core import bus
from populace.core.contracts import RunConfig

AGENTS, ROUNDS = 2000, 4
CONFIG = {"agents": AGENTS, "rounds": ROUNDS, "seed": 8, "model": {"latency_s": 0.6, "seed": 31}}
ENV = {"POPULACE_STORAGE": "file", "POPULACE_HEARTBEAT_S": "0.5", "POPULACE_HOST_LOST_S": "4",
       "POPULACE_REGISTRY_TTL_S": "4", "POPULACE_INFER_TIMEOUT_S": "5", "POPULACE_INFER_DOWN_S": "10",
       "POPULACE_RECORDER_ACK_WAIT_S": "3", "POPULACE_ACK_WAIT_S": "3"}
KILLED = ["orchestrator", "environment", "recorder", "agent-host-0", "agent-host-1", "gateway"]


def rows(db: str, rid: str) -> tuple[list, list]:
    with duckdb.connect(db, read_only=True) as con:
        return (con.execute("SELECT round, agent_id, value, valid, raw, error FROM guesses WHERE run_id = ? "
                            "ORDER BY round, agent_id", [rid]).fetchall(),
                con.execute("SELECT round, n, n_valid, mean, target, winner_agent_id, winner_value, n_winners "
                            "FROM rounds WHERE run_id = ? ORDER BY round", [rid]).fetchall())


def kill_later(stack: Stack, key: str, at_s: float, pause_s: float, sig: int) -> threading.Thread:
    def fault() -> None:
        time.sleep(max(0.0, at_s))
        stack.kill(key, sig)
        time.sleep(pause_s)
        stack.restart(key)
    thread = threading.Thread(target=fault, daemon=True)
    thread.start()
    return thread


async def trial(stack: Stack, rnd: random.Random, mode: str, reference_s: float) -> tuple[str, str, list[str]]:
    """One trial: (its description, the run id, why it is not exact: empty if it is)."""
    await stack.wait_ready(timeout=90)
    prepared, rid = prepare(RunConfig.model_validate(CONFIG)), new_run_id()
    nc = await bus.connect(stack.url, "chaos")
    try:
        playing = asyncio.create_task(play(nc, prepared.config, run_id=rid, manifest=prepared.manifest, stall_s=60))
        if mode == "kill":
            key, sig = rnd.choice(KILLED), rnd.choice([signal.SIGKILL, signal.SIGKILL, signal.SIGTERM])
            at, pause = rnd.uniform(0.0, reference_s), rnd.uniform(0.0, 1.5)
            what = f"{key} {sig.name} at {at:.2f}s, back after {pause:.2f}s"
            fault = kill_later(stack, key, at, pause, sig)
            out = await asyncio.wait_for(playing, 240)
        else:
            at = rnd.uniform(0.2, reference_s * 0.8)
            kill_at, pause = at + rnd.uniform(-0.3, 0.3), rnd.uniform(0.0, 2.0)
            what = f"cancel at {at:.2f}s, orchestrator SIGKILL at {kill_at:.2f}s, resume {pause:.2f}s after"
            fault = kill_later(stack, "orchestrator", kill_at, 0.5, signal.SIGKILL)
            await asyncio.sleep(at)
            await cancel(nc, rid, "chaos")
            first = await asyncio.wait_for(playing, 120)
            await asyncio.to_thread(fault.join, 60)
            await asyncio.sleep(pause)
            out = first if first.status == "completed" else await asyncio.wait_for(resume(nc, rid, stall_s=60), 240)
        await asyncio.to_thread(fault.join, 60)
    finally:
        await nc.close()
    wrong = []
    if out.status != "completed":
        wrong.append(f"{out.status}: {out.reason}")
    elif out.recorded is None or out.recorded.outcomes != AGENTS * ROUNDS:
        wrong.append(f"recorded {out.recorded}")
    return what, rid, wrong


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mode", choices=["kill", "cancel"], default="kill")
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="populace-chaos-") as tmp:
        stack = Stack(hosts=2, db=str(Path(tmp) / "chaos.duckdb"), env=ENV)
        with stack.up(timeout=90):
            t0 = time.monotonic()
            reference = asyncio.run(asyncio.wait_for(_play(stack), 240))
            reference_s = time.monotonic() - t0
            expected = rows(stack.db, reference)
            print(f"reference run {reference}: {reference_s:.1f} s (logs: {stack.log_dir})", flush=True)
            bad = 0
            for n in range(args.trials):
                t0 = time.monotonic()
                try:
                    what, rid, wrong = asyncio.run(trial(stack, rnd, args.mode, reference_s))
                    if not wrong and rows(stack.db, rid) != expected:
                        wrong.append("rows differ from the reference run's")
                except Exception as err:  # a trial that raised is a finding too
                    what, rid, wrong = "(raised)", "-", [f"{type(err).__name__}: {err}"]
                bad += bool(wrong)
                print(f"trial {n}: {what} -> {time.monotonic() - t0:.1f} s, "
                      f"{'EXACT' if not wrong else 'WRONG ' + '; '.join(wrong)} (run {rid})", flush=True)
            print(f"{args.trials - bad} of {args.trials} exact (mode {args.mode}, seed {args.seed})", flush=True)
    return 1 if bad else 0


async def _play(stack: Stack) -> str:
    await stack.wait_ready(timeout=90)
    prepared = prepare(RunConfig.model_validate(CONFIG))
    nc = await bus.connect(stack.url, "chaos")
    try:
        out = await play(nc, prepared.config, manifest=prepared.manifest, stall_s=60)
    finally:
        await nc.close()
    if out.status != "completed":
        raise SystemExit(f"the reference run did not complete: {out.status}: {out.reason}")
    return out.run_id


if __name__ == "__main__":
    sys.exit(main())
