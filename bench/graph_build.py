"""Build, store and place a run's social graph at scale (populace.graph; no broker).

    uv run python bench/graph_build.py --agents 1000000 --degree 10 --out bench/results/graph-1m.json

For each generator (small-world, scale-free, homophily at each --strength, and an edge list
read back from Parquet): build seconds, the CSR's bytes per agent, canonical bytes + sha256
seconds, and for k = 2 and 8 equal hosts: placement seconds and the edge-cut fraction and
cross-host posts of today's contiguous ranges against graph-aware placement.

Cross-host posts: in a round where every agent posts once and posts travel batched per host
pair, an author's post crosses once to each other host holding one of its hearers; cross-host
bytes are this × the mean post size. The homophily attribute has --categories values, drawn
uniformly and shuffled over the ids (as sampled personas are), so contiguous ranges see no
structure. One measurement per configuration (a 2-core machine shared with others).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from populace.graph import (
    contiguous_parts,
    cross_host_posts,
    digest,
    dumps,
    edge_cut,
    homophily,
    load_edge_list,
    loads,
    place_graph,
    scale_free,
    small_world,
)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def measure(name: str, graph, build_s: float, ks: list[int], extra: dict | None = None) -> dict:
    n = graph.n
    data, ser_s = timed(lambda: dumps(graph))
    key, dig_s = timed(lambda: digest(data))
    _, load_s = timed(lambda: loads(data, expect_digest=key))
    row = {"generator": name, **(extra or {}), "build_s": round(build_s, 2), "entries": graph.entries,
           "mean_degree": round(graph.mean_degree(), 4), "max_in_degree": int(graph.in_degree().max()),
           "max_out_degree": int(graph.out_degree().max()),
           "csr_bytes_per_agent": round(graph.nbytes / n, 2), "stored_bytes": len(data),
           "serialize_s": round(ser_s, 2), "sha256_s": round(dig_s, 2), "load_verify_s": round(load_s, 2),
           "placement": {}}
    print(f"{name:<22} build {build_s:6.2f} s  {graph.nbytes / n:6.1f} B/agent  mean degree "
          f"{graph.mean_degree():.3f}  dumps+sha256+loads {ser_s + dig_s + load_s:.2f} s", flush=True)
    for k in ks:
        caps = {f"h{i}": -(-n // k) for i in range(k)}
        _, contiguous = contiguous_parts(n, caps)
        placed, place_s = timed(lambda caps=caps: place_graph(graph, caps, seed=0))
        sizes = np.bincount(placed.part, minlength=k)
        share = n / k
        cut_c, cut_g = edge_cut(graph, contiguous), edge_cut(graph, placed.part)
        posts_c, posts_g = cross_host_posts(graph, contiguous), cross_host_posts(graph, placed.part)
        row["placement"][f"k{k}"] = {
            "place_s": round(place_s, 2), "method": placed.method,
            "max_imbalance": round(float(np.abs(sizes - share).max() / share), 4),
            "edge_cut_contiguous": round(cut_c, 4), "edge_cut_graph_aware": round(cut_g, 4),
            "edge_cut_ratio": round(cut_c / cut_g, 2) if cut_g else None,
            "cross_host_posts_contiguous": posts_c, "cross_host_posts_graph_aware": posts_g,
            "cross_host_posts_ratio": round(posts_c / posts_g, 2) if posts_g else None,
        }
        print(f"{'':<22} k={k}: place {place_s:5.1f} s ({placed.method})  edge cut {cut_c:.3f} → {cut_g:.3f}  "
              f"cross-host posts {posts_c:,} → {posts_g:,}", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=1_000_000)
    ap.add_argument("--degree", type=int, default=10, help="mean degree (scale-free: m = degree/2)")
    ap.add_argument("--rewire", type=float, default=0.1, help="small-world rewiring probability")
    ap.add_argument("--categories", type=int, default=16, help="values of the homophily attribute")
    ap.add_argument("--strength", type=float, nargs="+", default=[0.8, 0.95], help="homophily strengths")
    ap.add_argument("--hosts", type=int, nargs="+", default=[2, 8], help="host counts k")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/graph-1m.json"))
    args = ap.parse_args()
    n, d = args.agents, args.degree
    rows = []
    g, s = timed(lambda: small_world(n, d, args.rewire, seed=args.seed))
    rows.append(measure("small-world", g, s, args.hosts, {"degree": d, "rewire": args.rewire}))
    with tempfile.TemporaryDirectory() as tmp:  # the same graph as an edge list file, read back
        path = Path(tmp) / "edges.parquet"
        upper = g.sources < g.targets()
        pq.write_table(pa.table({"source": g.sources[upper], "target": g.targets()[upper]}), path)
        e, s = timed(lambda: load_edge_list(path, n, directed=False, self_loops=False))
        assert np.array_equal(e.sources, g.sources)
        rows.append(measure("edges (parquet)", e, s, [], {"file_bytes": path.stat().st_size}))
    del g, e
    g, s = timed(lambda: scale_free(n, max(1, d // 2), seed=args.seed))
    rows.append(measure("scale-free", g, s, args.hosts, {"m": max(1, d // 2)}))
    del g
    codes = np.random.default_rng(args.seed).integers(0, args.categories, n)
    for strength in args.strength:
        g, s = timed(lambda strength=strength: homophily(n, d, strength, codes, seed=args.seed))
        same = float((codes[g.sources] == codes[g.targets()]).mean())
        rows.append(measure(f"homophily s={strength}", g, s, args.hosts,
                            {"degree": d, "strength": strength, "categories": args.categories,
                             "same_attribute_share": round(same, 4)}))
        del g
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = {"agents": n, "degree": d, "seed": args.seed, "generators": rows,
           "peak_rss_bytes": peak, "peak_rss_bytes_per_agent": round(peak / n, 1),
           "machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                       "numpy": np.__version__},
           "command": "uv run python bench/graph_build.py " + " ".join(sys.argv[1:])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"peak RSS {peak / 2**20:.0f} MiB ({peak / n:.0f} B/agent, the whole bench process); wrote {args.out}")


if __name__ == "__main__":
    main()
