"""Exclusive claims at scale: `populace.sdk.claims.grant` for N agents, each claiming K cells of a
grid, best first (what an environment's decide does once a round). Two cases: claims spread over
a large grid (few collisions), and every agent after the same few targets (the worst case for
deferred acceptance: a pass per choice, each over the agents still open).

    uv run python bench/micro/claims_grant.py --agents 1000000 --choices 5

Prints one JSON line per case: CPU seconds building the claims (`Claims.ranked` from a 2-D array,
as a reduce with a vectorised view would) and granting them, the grant's size and its losers."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from populace.sdk.claims import Claims


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=1_000_000)
    ap.add_argument("--choices", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    ids = np.arange(args.agents)
    for case, cells in (("spread", 2 * args.agents), ("contested", 200)):
        choices = rng.integers(0, cells, (args.agents, args.choices))
        t0 = time.process_time()
        claims = Claims.ranked(ids, choices)
        t1 = time.process_time()
        won = claims.grant(cells, seed=1, round=1, what="cell")
        t2 = time.process_time()
        print(json.dumps({"case": case, "agents": args.agents, "choices": args.choices, "cells": cells,
                          "build_cpu_s": round(t1 - t0, 3), "grant_cpu_s": round(t2 - t1, 3),
                          "granted": len(won), "lost": int(won.lost.size)}))


if __name__ == "__main__":
    main()
