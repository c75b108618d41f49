"""What interviews cost on the fleet, on a private stack (2 agent-hosts, memory storage), on the
dummy model with a latency per answer:

- a panel: the ratio game for --rounds rounds, with and without one options question asked of
  every agent after every round; each round's time (open → result), so what the interviews
  running beside the next round add to it;
- post hoc: the same question asked after round 1 of the run without the panel, from request
  to every answer recorded, beside that run's round time; and the stack's peak RSS during it.

    uv run python bench/interviews.py --agents 100000 --rounds 4 --latency 1.0 --out bench/results/interviews-100k.json
    uv run python bench/interviews.py --agents 1000000 --rounds 1 --no-panel \
        --out bench/results/interviews-1m-post-hoc.json

With --no-panel the panel run is skipped: the post-hoc interview follows the plain run directly,
so its peak memory is compared with that run's alone (the hosts keep what a run before it grew).
Each phase's peak is every process's own peak during it (`peak_rss_bytes_by_process`) beside
what each process held when the phase began (`start_rss_bytes_by_process`): a phase begins
with whatever the one before it left. --storage file keeps the streams on disk instead of in
nats-server's memory (the bench's default, memory, holds every stored message in that process).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from populace.bench.dummy import RssSampler
from populace.client.interviews import ask
from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus
from populace.core.contracts import RunConfig, Survey

QUESTION = {"id": "again", "text": "Would you play this game again?", "options": ["yes", "no", "maybe"]}


def config(agents: int, rounds: int, latency: float, panel: bool) -> RunConfig:
    data = {"name": "bench-interviews", "agents": agents, "rounds": rounds,
            "model": {"backend": "dummy", "latency_s": latency}}
    if panel:
        data["interviews"] = [{"id": "panel", "after": "every", "questions": [QUESTION]}]
    return RunConfig.model_validate(data)


async def run(url: str, cfg: RunConfig) -> dict:
    nc = await bus.connect(url, "populace-bench-interviews")
    try:
        out = await play(nc, cfg, stall_s=900)
    finally:
        await nc.close()
    if out.status != "completed":
        raise RuntimeError(f"run {out.run_id} {out.status}: {out.reason}")
    m = out.marks
    return {"run_id": out.run_id, "round_s": [m[f"result.{n}"] - m[f"open.{n}"] for n in range(1, cfg.rounds + 1)],
            "record_lag_s": m["recorded"] - m[f"result.{cfg.rounds}"], "answers": out.recorded.answers}


async def post_hoc(url: str, run_id: str) -> dict:
    nc = await bus.connect(url, "populace-bench-interviews")
    try:
        t0 = time.perf_counter()
        done = await ask(nc, run_id, 1, Survey(id="later", questions=[QUESTION]), timeout_s=1800)
        return {"seconds": time.perf_counter() - t0, "answers": done.recorded.answers}
    finally:
        await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--no-panel", action="store_true", help="skip the panel run (post hoc only)")
    parser.add_argument("--storage", choices=("memory", "file"), default="memory",
                        help="where JetStream keeps the streams (POPULACE_STORAGE)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="populace-bench-interviews-")
    stack = Stack(hosts=args.hosts, db=str(Path(work) / "bench.duckdb"), log_dir=str(Path(work) / "logs"),
                  env={"POPULACE_STORAGE": args.storage, "POPULACE_LOG_LEVEL": "INFO"})
    try:
        stack.start()
        asyncio.run(stack.wait_ready(timeout=120))
        time.sleep(1.0)
        baseline = stack.rss_bytes()
        plain_start = stack.rss_by_process()
        with RssSampler(stack) as plain_rss:
            plain = asyncio.run(run(stack.url, config(args.agents, args.rounds, args.latency, panel=False)))
        print(f"without interviews: rounds {[round(t, 2) for t in plain['round_s']]} s", flush=True)
        panel, panel_rss = None, None
        if not args.no_panel:
            with RssSampler(stack) as panel_rss:
                panel = asyncio.run(run(stack.url, config(args.agents, args.rounds, args.latency, panel=True)))
            print(f"with a panel question every round: rounds {[round(t, 2) for t in panel['round_s']]} s, "
                  f"{panel['answers']:,} answers (+{panel['record_lag_s']:.2f} s to record after the last round)",
                  flush=True)
        hoc_start = stack.rss_by_process()
        with RssSampler(stack) as hoc_rss:
            hoc = asyncio.run(post_hoc(stack.url, plain["run_id"]))
        print(f"post hoc after round 1: {hoc['answers']:,} answers in {hoc['seconds']:.2f} s", flush=True)
    finally:
        stack.stop()
    # rounds 2..: the rounds beside which the previous round's interviews run (round 1 has none)
    later = slice(1, None)
    result = {
        "agents": args.agents, "rounds": args.rounds, "latency_s": args.latency, "hosts": args.hosts,
        "storage": args.storage,
        "round_s_plain": plain["round_s"], "plain_record_lag_s": plain["record_lag_s"],
        "post_hoc_s": hoc["seconds"], "post_hoc_answers": hoc["answers"],
        "post_hoc_ratio_to_round": hoc["seconds"] / plain["round_s"][0],
        "peak_rss_bytes": {"run": plain_rss.peak, "panel_run": panel_rss.peak if panel_rss else None,
                           "post_hoc": hoc_rss.peak, "baseline": baseline},
        "peak_rss_bytes_by_process": {"run": plain_rss.peak_by_process, "post_hoc": hoc_rss.peak_by_process},
        "start_rss_bytes_by_process": {"run": plain_start, "post_hoc": hoc_start},
        **({} if panel is None or args.rounds < 2 else {
            "round_s_panel": panel["round_s"],
            "mean_round_s_plain": statistics.mean(plain["round_s"][later]),
            "mean_round_s_panel": statistics.mean(panel["round_s"][later]),
            "panel_ratio": statistics.mean(panel["round_s"][later]) / statistics.mean(plain["round_s"][later]),
            "panel_answers": panel["answers"], "panel_record_lag_s": panel["record_lag_s"]}),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
