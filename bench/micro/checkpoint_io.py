"""What one checkpoint write and read cost on a real nats-server (memory storage): a host range's
full checkpoint of 100,000 agents (~0.8 MB, 7 chunks) and an environment's small state, written
`--big` and `--small` times each under new names, then each read back and checked against its
digest. The same script runs on a checkout before issue 41 (nats-py's object-store reads), so one
file compares two commits: run it alternating, several times each.

    uv run python bench/micro/checkpoint_io.py

Prints one JSON line: milliseconds per write and per read of each size.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import time

import nats

from populace.core import bus, checkpoints
from populace.core.natsserver import EmbeddedNats


async def measure(big_n: int, small_n: int) -> dict:
    with EmbeddedNats() as ns:
        nc = await nats.connect(ns.url)
        js = nc.jetstream()
        await bus.provision(js, storage="memory")
        big = {"first": 0, "count": 100_000, "fields": {"memory": [[i % 7, i % 11] for i in range(100_000)]}}
        small = {"state": {"x": 1}, "observation": {"round": 3}}
        bound = "writer" in inspect.signature(checkpoints.get).parameters  # objects bound to their writer
        out: dict = {}
        for label, value, n in (("big", big, big_n), ("small", small, small_n)):
            names = [f"run-{label}.{r}.agents.0" for r in range(1, n + 1)]
            t0 = time.perf_counter()
            stored = [await checkpoints.put(js, name, value, writer="h0") for name in names]
            out[f"write_{label}_ms"] = round((time.perf_counter() - t0) / n * 1000, 3)
            digests = {s.name: s.digest for s in stored}
            t0 = time.perf_counter()
            for name in names:
                await (checkpoints.get(js, name, digests, "h0") if bound else checkpoints.get(js, name, digests))
            out[f"read_{label}_ms"] = round((time.perf_counter() - t0) / n * 1000, 3)
            out[f"{label}_bytes"] = stored[0].size
        await nc.close()
        return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--big", type=int, default=30)
    parser.add_argument("--small", type=int, default=300)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.big, args.small))))


if __name__ == "__main__":
    main()
