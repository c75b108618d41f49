"""Was every inbox exact? Recomputed from what the recorder stored and the run's graph: in
round n, agent a heard exactly its in-neighbours' posts of round n-1 — as many, and the sum of
their digests (populace.sdk.post.post_hash) equal to the one the platform recorded for a. In a
run whose graph changes, a's in-neighbours in round n are the graph plus a's recorded edits
(table `edges`, of the edge kind that is the graph's) up to round n-1."""

from __future__ import annotations

import json
from dataclasses import dataclass

import duckdb
import numpy as np

from populace.graph.csr import Graph
from populace.sdk.post import post_hash

_MASK63 = (1 << 63) - 1


@dataclass
class InboxCheck:
    rounds: int
    agents: int
    rows: int  # posts rows of the run (one per agent per round when complete)
    missing_rows: int  # (round, agent) without a posts row
    wrong: list[tuple[int, int, str]]  # (round, agent, why), the first few

    @property
    def exact(self) -> bool:
        return self.missing_rows == 0 and not self.wrong


def _edits(con: duckdb.DuckDBPyConnection, run_id: str, kind: str) -> dict[int, list[tuple[int, str, int]]]:
    """follower -> [(round, op, author)] in the order they applied (none when the run has no
    `edges` table)."""
    has = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'edges'").fetchone()
    if not has or not has[0]:
        return {}
    out: dict[int, list[tuple[int, str, int]]] = {}
    for r, follower, author, op in con.execute(
            "SELECT round, follower, author, op FROM edges WHERE run_id = ? AND kind = ? "
            "ORDER BY round, follower, rowid", [run_id, kind]).fetchall():
        out.setdefault(follower, []).append((r, op, author))
    return out


def check_inboxes(con: duckdb.DuckDBPyConnection, run_id: str, graph: Graph, rounds: int,
                  limit: int = 20, kind: str = "follow") -> InboxCheck:
    """`kind`: the edge kind the graph's edges are (a simulation's first `edge_kinds`)."""
    n = graph.n
    edits = _edits(con, run_id, kind)

    def sources(aid: int, rnd: int) -> np.ndarray:
        nb = graph.sources[graph.offsets[aid]:graph.offsets[aid + 1]]
        if aid not in edits:
            return nb
        now = set(nb.tolist())
        for r, op, author in edits[aid]:
            if r < rnd:
                (now.add if op == "add" else now.discard)(author)
        return np.asarray(sorted(now), dtype=np.int64)

    rows = con.execute("SELECT round, agent_id, text, fields, heard, heard_digest FROM posts WHERE run_id = ? "
                       "ORDER BY round, agent_id", [run_id]).fetchall()
    by_round: dict[int, list] = {}
    for r in rows:
        by_round.setdefault(r[0], []).append(r)
    missing = 0
    wrong: list[tuple[int, int, str]] = []
    prev_hash = np.zeros(n, dtype=object)
    prev_has = np.zeros(n, dtype=bool)
    for rnd in range(1, rounds + 1):
        got = by_round.get(rnd, [])
        missing += n - len({r[1] for r in got})
        hashes = np.zeros(n, dtype=object)
        has = np.zeros(n, dtype=bool)
        for _, aid, text, fields, heard, digest in got:
            nb = sources(aid, rnd)
            count = int(prev_has[nb].sum())
            total = sum(int(prev_hash[s]) for s in nb if prev_has[s]) & _MASK63
            if (heard, digest) != (count, total) and len(wrong) < limit:
                wrong.append((rnd, aid, f"heard {heard} posts (digest {digest}), its in-neighbours posted "
                                        f"{count} (digest {total})"))
            if text is not None:
                has[aid] = True
                hashes[aid] = post_hash(aid, text, json.loads(fields) if fields is not None else None)
        prev_hash, prev_has = hashes, has
    return InboxCheck(rounds=rounds, agents=n, rows=len(rows), missing_rows=missing, wrong=wrong)
