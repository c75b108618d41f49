"""Where a run's rounds went, from table `round_profile` (one row per round and share, the
environment's and the recorder's): `populace results --profile`, the manager's run page.

A share's row (role `host`) holds the seconds the simulation's code held its host's event loop —
`view_s` (its env's `view`, timed whole), `turn_s` (turns, acts and scenes, estimated from timed
samples), `merge_s` (its group envs' settle, its env's reduce and merge) — the seconds it had a
model call out (`model_wait_s`, overlapping the rest), its round's `wall_s`, and the bytes of its
agents' views and of the round's shared observation. The environment's row holds its `merge_s`
of the shares' partials and its `decide_s`; the recorder's, the seconds it spent storing the
round (`record_s`)."""

from __future__ import annotations

import duckdb

from populace.store.lookup import check_runs
from populace.store.tables import has_table

# seconds columns, in the order a round goes: what the hosts' code did, the model, then the
# environment and the recorder
SECONDS = ("view_s", "turn_s", "merge_s", "model_wait_s", "decide_s", "record_s")
COLUMNS = ("round", "role", "host_id", "epoch", "agents", "wall_s", *SECONDS, "view_bytes", "view_max_bytes",
           "observation_bytes", "held", "note")
ROLE_ORDER = {"host": 0, "environment": 1, "recorder": 2}


def round_profile(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    """The run's rows, by round, then hosts (by share), the environment, the recorder. Empty
    for a run recorded before profiles were (or a database without the table); QueryError
    for a run the database does not have."""
    check_runs(con, [run_id])
    if not has_table(con, "round_profile"):
        return []
    rows = con.execute(f"SELECT {', '.join(COLUMNS)} FROM round_profile WHERE run_id = ?", [run_id]).fetchall()
    out = [dict(zip(COLUMNS, r)) for r in rows]
    out.sort(key=lambda r: (r["round"], ROLE_ORDER.get(r["role"], 9), r["host_id"] or "", r["epoch"] or 0))
    return out


def last_rounds(rows: list[dict], rounds: int) -> list[dict]:
    """The rows of the last `rounds` rounds (a page of a long run's profile)."""
    numbers = sorted({r["round"] for r in rows})[-rounds:] if rounds > 0 else []
    keep = set(numbers)
    return [r for r in rows if r["round"] in keep]


def profile_totals(rows: list[dict]) -> dict:
    """The run's seconds per column summed over its rounds and rows, the largest, and the notes
    said (each once): `{"seconds": {column: s}, "top": (column, s) | None, "notes": [..]}`."""
    seconds = {c: sum(r[c] or 0.0 for r in rows) for c in SECONDS}
    code = {c: s for c, s in seconds.items() if c != "model_wait_s" and s > 0}  # the model's wait overlaps the rest
    top = max(code.items(), key=lambda kv: kv[1]) if code else None
    notes = list(dict.fromkeys(r["note"] for r in rows if r.get("note")))
    return {"seconds": seconds, "top": top, "notes": notes}
