"""What a population that changes adds to a round, per process and in CPU seconds (process time,
not wall: a machine shared with other work inflates wall times far more than CPU): one agent-host's
share of the vote at 1% turnout (the agents it holds, `--agents` of a run twice that size), each
round its voters drawn, made and checkpointed as the agent-host does (a delta of those who
acted), and with `--turnover P` the environment's part (the schedule's departures drawn, who is
alive after them, its bytes) and the host's (who is alive read back, the departed let go, the
newcomers placed on it, their marks in the checkpoint). No NATS, no turns: the parts the
population adds, beside the parts it makes larger.

    uv run python bench/micro/population_round.py --agents 5000000 --rounds 4
    uv run python bench/micro/population_round.py --agents 5000000 --rounds 4 --turnover 0.01

Prints one JSON line: per part, the mean CPU seconds per round (rounds after the first: the first
has no population to apply), the checkpoint delta's bytes, and the living at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import time

from pydantic_core import to_json

from populace.core.contracts import RunConfig
from populace.core.placement import birth_block, place_births
from populace.population.living import Population, scheduled
from populace.sdk.hosting import host_run
from populace.sdk.registry import resolve


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=1_000_000, help="the agents this host holds (the run: twice)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--turnover", type=float, default=0.0)
    ap.add_argument("--profile", help="write a cProfile of the turnover's parts (decide, read, apply) here")
    a = ap.parse_args()
    n, total = a.agents, 2 * a.agents
    data = {"simulation": "vote", "agents": total, "ballot": {"turnout": 0.01}}
    if a.turnover:
        data["population"] = {"changes": [{"after": "every", "left": a.turnover,
                                           "arrived": round(a.turnover * total)}]}
    config = RunConfig.model_validate(data)
    run = host_run(resolve(config), "bench", [(0, n)], freeze=True)
    population = Population.start(total)
    placement = {"a@0": [(0, n)], "b@0": [(n, n)]}  # the other host's share: where its newcomers may go
    parts = dict.fromkeys(("decide", "read", "apply", "select", "checkpoint"), 0.0)
    sizes = []
    clock = time.process_time
    prof = cProfile.Profile()
    for r in range(1, a.rounds + 1):
        if a.turnover and r > 1:  # the changes after round r - 1, applied as round r opens
            t = clock()
            changes = scheduled(config.population.changes, population, r - 1, 0)
            population = population.after(changes, r - 1)
            blob = population.to_bytes()
            d = population.delta
            placement = place_births(placement, d.born_first, d.births, base=total, block=birth_block(total))
            parts["decide"] += clock() - t
            t = clock()
            read = Population.from_bytes(blob)
            parts["read"] += clock() - t
            t = clock()
            if a.profile:
                prof.enable()
            run.apply(read, placement["a@0"])
            if a.profile:
                prof.disable()
            parts["apply"] += clock() - t
        t = clock()
        picked = run.engine.selected(r, {"kind": "rate", "p": 0.01, "salt": 0}, None)
        run.acted(picked)
        if r > 1:
            parts["select"] += clock() - t
        t = clock()
        changed = run.take_changed()  # None: the first checkpoint, a full one
        ranges = asyncio.run(run.snapshot() if changed is None else run.snapshot_of(changed))
        size = sum(len(to_json({"fields": p.columns, "changed": p.rows, **p.marks})) for p in ranges)
        if r > 1:
            parts["checkpoint"] += clock() - t
            sizes.append(size)
        gc.collect(0)
    if a.profile:
        prof.dump_stats(a.profile)
    rounds = max(1, a.rounds - 1)
    print(json.dumps({"agents_held": n, "turnover": a.turnover,
                      "cpu_s_per_round": {k: round(v / rounds, 4) for k, v in parts.items()},
                      "cpu_s_added_per_round": round(
                          sum(v for k, v in parts.items() if k in ("decide", "read", "apply")) / rounds, 4),
                      "checkpoint_delta_bytes": sizes, "living": run.count, "ranges": len(run.ranges)}))


if __name__ == "__main__":
    main()
