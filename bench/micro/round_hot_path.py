"""The round engine's hot path: one round for N agents of a simulation, played through the code an
agent-host runs (`host_run`, then its share engine), on the in-process dummy model with no latency.
No NATS, no services: what is left is the engine, the agents' turns, the dummy model's answers and
the outcome batches (validated, reduced, handed to an `emit` that drops them).

    uv run python bench/micro/round_hot_path.py --agents 200000
    uv run python bench/micro/round_hot_path.py --agents 200000 --profile /tmp/round.prof

Prints one JSON line: the round's CPU seconds (process time, the figure to compare; the median of
--repeat rounds), and per round its wall seconds, the set-up's CPU seconds (the agents built),
the garbage collections it caused per generation, and the rows played. The same script runs on
an older checkout whose host run has no engine (it drives that checkout's player and sink
directly), so one file compares two commits; time the whole process from outside as well (e.g.
`/usr/bin/time -v`), several runs each, alternating, on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import sys
import time

from populace.core import serve
from populace.core.contracts import RunConfig
from populace.sdk.hosting import host_run
from populace.sdk.mock import DummyLLM
from populace.sdk.registry import resolve


async def play_round(run, llm, emit, batch_size: int):
    engine = getattr(run, "engine", None)
    if engine is not None:  # the round engine (issue 22 on)
        return await engine.play(1, None, None, llm, emit=emit, batch_size=batch_size)
    from populace.sdk.play import OutcomeSink  # before the engine: the host drove player and sink itself

    sink = OutcomeSink(type(run.sim), run.env, batch_size=batch_size, emit=emit, grouped=run.tables.grouped)
    await run.player.play(run.observation(1, None), llm, sink)
    return sink.close()


def play_once(args: argparse.Namespace) -> dict | None:
    """Build the share's agents (as an agent-host does) and play round 1 once; None: rows went missing."""
    t0 = time.process_time()
    resolved = resolve(RunConfig(simulation=args.simulation, agents=args.agents, rounds=1))
    # freeze=True as an agent-host does: the agents leave the cyclic GC's generations
    run = host_run(resolved, "bench", [(0, args.agents)], None, freeze=True)
    sim = run.sim
    llm = DummyLLM(seed=resolved.config.model.seed, round_=1, system=sim.system_prompt(),
                   schema=sim.answer_schema())
    setup_cpu = time.process_time() - t0
    rows = 0

    def emit(batch) -> None:
        nonlocal rows
        rows += len(batch.agent_ids)

    profiler = cProfile.Profile() if args.profile else None
    gc.collect()
    collections = [g["collections"] for g in gc.get_stats()]
    cpu, wall = time.process_time(), time.perf_counter()
    if profiler is not None:
        profiler.enable()
    runner = serve.event_loop_runner() if args.loop == "uvloop" else asyncio.Runner()
    with runner:
        share = runner.run(play_round(run, llm, emit, args.batch_size))
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    collections = [g["collections"] - c for g, c in zip(gc.get_stats(), collections)]
    run.stop()
    gc.unfreeze()  # the next repeat's agents replace these
    if rows != args.agents or share.n != args.agents:
        print(f"error: {rows} rows emitted, share of {share.n}, for {args.agents} agents", file=sys.stderr)
        return None
    return {"round_cpu_s": round(cpu, 3), "round_wall_s": round(wall, 3), "setup_cpu_s": round(setup_cpu, 3),
            "gc_collections": collections, "rows": rows, "valid": share.n_valid}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=200_000, help="agents in the share (default 200000)")
    ap.add_argument("--simulation", default="ratio-game", help="a registered simulation (default ratio-game)")
    ap.add_argument("--batch-size", type=int, default=1000, help="outcomes per batch (the host's default 1000)")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                    help="the event loop: uvloop as an agent-host runs (default), or asyncio's own")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds played, each by a share built anew; the median's CPU is quoted (default 1)")
    ap.add_argument("--host-gc", action="store_true",
                    help="the collector's thresholds an agent-host holding these agents sets "
                         "(populace.agent_host.collector); default: CPython's")
    ap.add_argument("--profile", help="write a cProfile of the round (not the set-up) to this file")
    args = ap.parse_args(argv)
    if args.agents < 1:
        ap.error("--agents: at least 1")
    if args.repeat < 1:
        ap.error("--repeat: at least 1")
    if args.batch_size < 1:
        ap.error("--batch-size: at least 1")

    if args.host_gc:
        try:  # as an agent-host holding these agents sets them (older checkouts: their fixed thresholds)
            from populace.agent_host.collector import fit_to
        except ImportError:
            gc.set_threshold(100_000, 50, 100)
        else:
            fit_to(args.agents)
    rounds = [play_once(args) for _ in range(args.repeat)]
    if any(r is None for r in rounds):
        return 1
    cpus = sorted(r["round_cpu_s"] for r in rounds)
    print(json.dumps({"simulation": args.simulation, "agents": args.agents, "loop": args.loop,
                      "round_cpu_s": cpus[len(cpus) // 2], "round_cpu_min_s": cpus[0], "runs": rounds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
