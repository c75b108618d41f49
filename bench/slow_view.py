"""A simulation whose `Env.view` burns CPU for every agent (a recommender ranking a pool in plain
Python), on a private stack: does a host held by its simulation's code stay registered, and how
long does its event loop go without a turn? (issue 36, item 4)

    uv run python bench/slow_view.py --agents 4000 --view-ms 3 --rounds 2 --host-lost-s 4

Plays `slow_sims:SlowView` (tests/e2e/sims) on 2 agent-hosts with the dummy model, while a
watcher reads KV `hosts` every 0.1 s: the longest gap between two heartbeats each host wrote, and
the largest `loop_busy_s` a heartbeat reported (how long the host's loop had gone without a turn;
absent before the heartbeat had its own thread). Prints one JSON line: the run's status and
reason, its round times, those figures per host, and where the rounds went (table round_profile,
absent before it existed). Runs on an older checkout too (its services and its CLI from
PYTHONPATH), so one file compares two commits."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import duckdb

from populace.client.prepare import prepare
from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus, subjects
from populace.core.contracts import RunConfig

SIMS = Path(__file__).resolve().parents[1] / "tests" / "e2e" / "sims"


async def watch(url: str, stop: asyncio.Event, seen: dict[str, dict]) -> None:
    """Every 0.1 s, each host's entry: the longest gap between its heartbeats, its largest busy figure."""
    nc = await bus.connect(url, "bench-slow-view-watch")
    try:
        kv = await nc.jetstream().key_value(subjects.HOSTS_BUCKET)
        while not stop.is_set():
            for host in ("host-0", "host-1"):
                try:
                    entry = json.loads((await kv.get(host)).value)
                except Exception:
                    continue
                s = seen.setdefault(host, {"last_beat": entry["heartbeat_at"], "max_gap_s": 0.0, "max_busy_s": 0.0})
                if entry["heartbeat_at"] != s["last_beat"]:
                    s["max_gap_s"] = max(s["max_gap_s"], entry["heartbeat_at"] - s["last_beat"])
                    s["last_beat"] = entry["heartbeat_at"]
                s["max_busy_s"] = max(s["max_busy_s"], entry.get("loop_busy_s", 0.0))
            await asyncio.sleep(0.1)
    finally:
        await nc.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--view-ms", type=float, default=3.0, help="CPU each agent's view burns (default 3)")
    ap.add_argument("--host-lost-s", type=float, default=4.0, help="POPULACE_HOST_LOST_S (default 4)")
    ap.add_argument("--latency", type=float, default=1.0, help="the dummy model's latency (default 1.0)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(SIMS))
    tmp = Path(tempfile.mkdtemp(prefix="populace-slow-view-"))
    config = {"simulation": "slow_sims:SlowView", "agents": args.agents, "rounds": args.rounds, "seed": 1,
              "model": {"latency_s": args.latency, "seed": 1}, "slow": {"view_ms": args.view_ms}}
    prepared = prepare(RunConfig.model_validate(config))
    pythonpath = ":".join([str(SIMS), *sys.path[1:]])
    stack = Stack(hosts=2, db=str(tmp / "bench.duckdb"), log_dir=str(tmp / "logs"),
                  env={"PYTHONPATH": pythonpath, "POPULACE_STORAGE": "memory", "POPULACE_HEARTBEAT_S": "0.5",
                       "POPULACE_HOST_LOST_S": str(args.host_lost_s), "POPULACE_REGISTRY_TTL_S": "4"})
    seen: dict[str, dict] = {}

    async def go():
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(stack.url, stop, seen))
        nc = await bus.connect(stack.url, "bench-slow-view")
        try:
            return await play(nc, prepared.config, manifest=prepared.manifest, stall_s=600)
        finally:
            stop.set()
            await watcher
            await nc.close()

    try:
        stack.start()
        asyncio.run(stack.wait_ready(timeout=120))
        t0 = time.perf_counter()
        out = asyncio.run(go())
        wall = time.perf_counter() - t0
    finally:
        stack.stop()
    m = out.marks
    rounds = [round(m[f"result.{n}"] - m[f"open.{n}"], 2) for n in range(1, args.rounds + 1) if f"result.{n}" in m]
    profile = None
    with duckdb.connect(str(tmp / "bench.duckdb"), read_only=True) as con:
        has = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'round_profile'").fetchone()[0]
        if has:
            profile = [dict(zip(("round", "host", "view_s", "turn_s", "model_wait_s", "wall_s", "held"), r))
                       for r in con.execute("SELECT round, host_id, round(view_s, 2), round(turn_s, 3), "
                                            "round(model_wait_s, 2), round(wall_s, 2), held FROM round_profile "
                                            "WHERE run_id = ? AND role = 'host' ORDER BY round, host_id",
                                            [out.run_id]).fetchall()]
    print(json.dumps({"agents": args.agents, "view_ms": args.view_ms, "host_lost_s": args.host_lost_s,
                      "status": out.status, "reason": out.reason, "round_s": rounds, "run_wall_s": round(wall, 1),
                      "hosts": {h: {"max_heartbeat_gap_s": round(s["max_gap_s"], 2),
                                    "max_loop_busy_s": round(s["max_busy_s"], 2)} for h, s in sorted(seen.items())},
                      "round_profile": profile}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
