"""What recording a local run costs: a scenario played in this process (`run_local`, the dummy
model), then written to a fresh DuckDB file the way `populace run --local` writes it, timed apart
from the play (issue 40, item 4: a local run's rows reach the store as the fleet's wire batches).

    uv run python bench/local_record.py examples/guess-two-thirds.yaml --agents 20000 --rounds 3

Prints one JSON line: the agents, rounds and hosts, the seconds the play took, the seconds the
recording took (each of --repeat recordings, into a new file each) in wall-clock and CPU seconds
(every thread's: DuckDB's too; steadier on a shared machine), and the outcome rows recorded.
Runs on an older checkout too (record_local with the run's column tables, before the wire
batches), so one file compares two commits."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import tempfile
import time
from pathlib import Path

from populace.client.prepare import load_scenario_data, parse_config, prepare
from populace.population.cast import cast_from_jsonl
from populace.sdk.local import LocalResult, run_local
from populace.store.local_runs import record_local


def record(db: Path, prepared, result: LocalResult) -> int:
    """The run written as the client writes it (populace.client.api._local)."""
    common = {"run_id": result.run_id, "config": prepared.config, "tables": result.tables, "rounds": result.rounds,
              "personas": prepared.personas, "interviews": result.interviews,
              "interview_calls": result.interview_usage, "profile": result.profile,
              "prototypes": result.prototype_reports, "population": result.population}
    if "batches" in inspect.signature(record_local).parameters:
        return record_local(db, batches=result.batches, **common)
    return record_local(db, outcomes=result.outcomes, posts=result.posts, acts=result.acts,  # before the batches
                        transcripts=result.transcripts, edges=result.edges, shown=result.shown,
                        audits=result.audits, **common)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("--agents", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    path = Path(args.scenario)
    data, _ = load_scenario_data(path)
    config = parse_config({**data, "agents": args.agents, "rounds": args.rounds})
    prepared = prepare(config, base=path.parent, agents_given=True)
    cast = cast_from_jsonl(prepared.personas) if prepared.personas is not None else None
    t0 = time.perf_counter()
    result = asyncio.run(run_local(prepared.resolved, cast=cast, hosts=args.hosts, keep_states=False))
    play_s = time.perf_counter() - t0
    record_s, cpu_s, rows = [], [], 0
    with tempfile.TemporaryDirectory(prefix="populace-bench-") as tmp:
        for i in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            rows = record(Path(tmp) / f"run{i}.duckdb", prepared, result)
            record_s.append(round(time.perf_counter() - t0, 3))
            cpu_s.append(round(time.process_time() - c0, 3))
    print(json.dumps({"scenario": args.scenario, "agents": args.agents, "rounds": args.rounds, "hosts": args.hosts,
                      "play_s": round(play_s, 2), "record_s": record_s, "record_cpu_s": cpu_s, "outcomes": rows}))


if __name__ == "__main__":
    main()
