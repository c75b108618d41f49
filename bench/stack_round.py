"""The dummy benchmark's round against a stack that is already running — compose's containers
or `populace up`'s processes — so the two are measured alike, from the same client:

    uv run python bench/stack_round.py --nats nats://127.0.0.1:4222 --label compose --agents 100000

Each repetition plays one run of --rounds rounds (every agent's answer takes --latency s on the
dummy model) and reads the orchestrator's marks: setup (placing and spawning the agents), each
round (its open to its result), and the lag until the recorder stored every outcome. With
--out, the JSON lines are appended to that file."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path

from populace.client.run import play
from populace.core import bus
from populace.core.contracts import RunConfig


async def once(url: str, agents: int, rounds: int, latency: float) -> dict:
    config = RunConfig.model_validate({"name": "stack-round", "agents": agents, "rounds": rounds,
                                       "model": {"backend": "dummy", "latency_s": latency}})
    nc = await bus.connect(url, "populace-bench-stack")
    try:
        out = await play(nc, config, stall_s=600)
    finally:
        await nc.close()
    if out.status != "completed":
        raise RuntimeError(f"run {out.run_id} {out.status}: {out.reason}")
    m = out.marks
    return {"run_id": out.run_id, "setup_s": m["spawned"] - m["submitted"],
            "round_s": [m[f"result.{n}"] - m[f"open.{n}"] for n in range(1, rounds + 1)],
            "record_lag_s": m["recorded"] - m[f"result.{rounds}"], "recorded": out.recorded.outcomes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats", required=True, help="NATS URL of the running stack")
    parser.add_argument("--label", required=True, help="what the stack is, e.g. compose or populace-up")
    parser.add_argument("--agents", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs = []
    for i in range(args.repeat):
        # the machine is shared: the load average beside each figure says what else ran
        load_before = os.getloadavg()
        r = asyncio.run(once(args.nats, args.agents, args.rounds, args.latency))
        r["load_avg_before"], r["load_avg_after"] = load_before, os.getloadavg()
        runs.append(r)
        print(f"{args.label} run {i + 1}: setup {r['setup_s']:.2f}s, round {statistics.mean(r['round_s']):.2f}s, "
              f"recorded {r['recorded']:,} (+{r['record_lag_s']:.2f}s), load {load_before[0]:.1f} -> "
              f"{r['load_avg_after'][0]:.1f}", flush=True)
    rounds = [t for r in runs for t in r["round_s"]]
    result = {"label": args.label, "agents": args.agents, "rounds": args.rounds, "latency_s": args.latency,
              "repeat": args.repeat, "round_s_median": statistics.median(rounds), "round_s_min": min(rounds),
              "setup_s_median": statistics.median(r["setup_s"] for r in runs), "runs": runs,
              "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"python": platform.python_version(), "platform": platform.platform(),
                          "cpus": os.cpu_count()}}
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    if args.out:
        with args.out.open("a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
