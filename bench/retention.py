"""Bounded storage, measured: stream RUN's size after many runs with the recorder purging
recorded runs' outcome batches and call records, and without.

    uv run python bench/retention.py --runs 100 --agents 1000 --rounds 3 --out bench/results/retention.json

Each mode gets its own stack (embedded nats-server with file storage, every service its own
process, 2 agent-hosts, dummy model with no latency); the runs are played one after another,
each waited for until recorded, and the streams' sizes read after each."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from populace.client.prepare import prepare
from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus, subjects
from populace.core.contracts import RunConfig

MODES = {
    "purge_off": {"POPULACE_PURGE_RECORDED": "false", "POPULACE_CHECKPOINTS_KEEP": "all"},
    "purge_on": {"POPULACE_PURGE_RECORDED": "true", "POPULACE_CHECKPOINTS_KEEP": "all"},
    "purge_on_checkpoints_last": {"POPULACE_PURGE_RECORDED": "true", "POPULACE_CHECKPOINTS_KEEP": "last"},
}
CHECKPOINTS_STREAM = f"OBJ_{subjects.CHECKPOINTS_BUCKET}"


async def play_many(url: str, runs: int, config: RunConfig) -> dict:
    nc = await bus.connect(url, "bench-retention")
    js = nc.jetstream()
    series: list[dict] = []
    try:
        for i in range(runs):
            t0 = time.perf_counter()
            out = await play(nc, config, stall_s=300)
            seconds = time.perf_counter() - t0
            if out.status != "completed" or out.recorded is None:
                raise RuntimeError(f"run {out.run_id} {out.status}: {out.reason}")
            run_state = (await js.stream_info(subjects.RUN_STREAM)).state
            ckpt = (await js.stream_info(CHECKPOINTS_STREAM)).state
            series.append({"run": i + 1, "seconds": round(seconds, 3), "run_bytes": run_state.bytes,
                           "run_messages": run_state.messages, "checkpoint_bytes": ckpt.bytes})
    finally:
        await nc.close()
    return {"series": series}


def measure(mode: str, runs: int, config: RunConfig) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"retention-{mode}-"))
    stack = Stack(hosts=2, db=str(work / "populace.duckdb"), env={**MODES[mode], "POPULACE_STORAGE": "file"})
    stack.start()
    try:
        asyncio.run(stack.wait_ready(timeout=120))
        result = asyncio.run(play_many(stack.url, runs, config))
    finally:
        stack.stop()
    s = result["series"]
    last = s[-1]
    result.update({
        "env": MODES[mode],
        "run_bytes_after_first": s[0]["run_bytes"],
        "run_bytes_after_last": last["run_bytes"],
        "run_messages_after_last": last["run_messages"],
        "run_bytes_per_run": round((last["run_bytes"] - s[0]["run_bytes"]) / max(1, len(s) - 1)),
        "checkpoint_bytes_after_last": last["checkpoint_bytes"],
        "median_run_seconds": round(statistics.median(r["seconds"] for r in s), 3),
    })
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--agents", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--out", default="bench/results/retention.json")
    a = p.parse_args()
    config = prepare(RunConfig.model_validate({"agents": a.agents, "rounds": a.rounds, "seed": 3,
                                               "model": {"latency_s": 0.0, "seed": 21}})).config
    report = {"runs": a.runs, "agents": a.agents, "rounds": a.rounds, "hosts": 2, "storage": "file",
              "model": "dummy, latency 0", "modes": {}}
    for mode in a.modes.split(","):
        t0 = time.perf_counter()
        report["modes"][mode] = measure(mode, a.runs, config)
        m = report["modes"][mode]
        print(f"{mode}: RUN {m['run_bytes_after_last']:,} bytes / {m['run_messages_after_last']:,} messages "
              f"after {a.runs} runs ({m['run_bytes_per_run']:,} bytes per run), checkpoints "
              f"{m['checkpoint_bytes_after_last']:,} bytes, median run {m['median_run_seconds']} s "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
