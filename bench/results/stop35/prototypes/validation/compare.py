"""The SmolLM2 validation's figures (docs/prototypes.md): a full run and prototype runs of the same
scenario and seeds, each in its own DuckDB file. Per round and education level: the real
Wasserstein-1 between the full run's guesses and the prototype run's recorded guesses (own and
drawn), beside the audits' estimate and its 95% interval; the model calls of each run.

    uv run python bench/results/stop35/prototypes/validation/compare.py full.duckdb p10.duckdb p05.duckdb
"""

from __future__ import annotations

import json
import sys

import duckdb
import numpy as np

from populace.sdk.prototypes import w1


def guesses(db: str) -> dict[tuple[int, str], np.ndarray]:
    with duckdb.connect(db, read_only=True) as con:
        rows = con.execute("SELECT g.round, json_extract_string(p.profile, '$.education'), g.value FROM guesses g "
                           "JOIN agent_profiles p USING (run_id, agent_id) WHERE g.valid").fetchall()
    out: dict[tuple[int, str], list] = {}
    for r, edu, v in rows:
        out.setdefault((r, edu), []).append(float(v))
        out.setdefault((r, "all"), []).append(float(v))
    return {k: np.asarray(v) for k, v in out.items()}


def dist(a: np.ndarray, b: np.ndarray) -> float:
    return w1(a, np.ones(a.size), b, np.ones(b.size))


def run_facts(db: str) -> dict:
    with duckdb.connect(db, read_only=True) as con:
        calls, n = con.execute("SELECT sum(llm_calls), sum(n) FROM rounds").fetchone()
        means = [round(m, 2) for (m,) in con.execute("SELECT mean FROM rounds ORDER BY round").fetchall()]
        has = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'prototype_rounds'"
                          ).fetchone()[0]
        audits = {}
        if has:
            for r, lab, d, lo, hi, reps, aud in con.execute(
                    "SELECT round, prototype, divergence, ci_low, ci_high, representatives, audited_valid "
                    "FROM prototype_rounds ORDER BY round, prototype").fetchall():
                audits[(r, lab.removeprefix("education="))] = (d, lo, hi, reps, aud)
    return {"calls": int(calls or 0), "outcomes": int(n or 0), "means": means, "audits": audits}


def main(full: str, *others: str) -> None:
    base = guesses(full)
    out = {"full": {k: v for k, v in run_facts(full).items() if k != "audits"}}
    for db in others:
        facts, mine = run_facts(db), guesses(db)
        rows = []
        for (r, edu), values in sorted(base.items()):
            est = facts["audits"].get((r, edu))
            rows.append({"round": r, "education": edu, "real_w1": round(dist(values, mine[(r, edu)]), 2),
                         **({"audit_w1": round(est[0], 2) if est[0] is not None else None,
                             "ci": [round(est[1], 2), round(est[2], 2)] if est[1] is not None else None,
                             "representatives": est[3], "audits": est[4]} if est else {})})
        out[db] = {"calls": facts["calls"], "outcomes": facts["outcomes"], "means": facts["means"],
                   "calls_share": round(facts["calls"] / max(1, facts["outcomes"]), 3), "rows": rows}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
