"""Tables computed from the recorder's DuckDB file (schema: populace.recorder.store.SCHEMA).

Every function takes an open DuckDB connection (read-only is enough) and returns plain
Python data: lists of dicts with fixed keys, ready to print, serialise or plot.

- ``run_info(con, run_id)``: the run's header (config, status, manifest, equilibrium).
- ``round_table(con, run_id)``: per round n, n_valid, n_invalid, mean, median, std, min,
  max (from the recorded valid guesses), target and winner (from the environment's result).
- ``group_table(con, run_ids, by, round=None)``: per group of a profile/persona attribute,
  the mean guess with a 95% CI across agents and, with several runs, across runs (seeds).
- ``convergence_table(con, run_ids)``: per run and round mean, median, target, winner and
  the distance of the mean to the game's equilibrium.
- ``attributes(con, run_id)`` / ``group_attributes(con, run_id)``: what one can group by.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from itertools import pairwise

import duckdb
import numpy as np

from populace.analysis.stats import AnalysisError, equilibrium, mean_ci, summary

NONE_GROUP = "(none)"
LEVEL = 0.95

# Ages are binned by decade, adults starting at 18, as survey tables do.
AGE_EDGES = (18, 30, 40, 50, 60, 70, 80)
# An ordinal ladder for education attributes (matched by substring, lower case); used only
# when every value of an attribute whose name mentions "educ" matches a rung.
EDUCATION_LADDER = (
    ("no formal", "none"), ("elementary", "primary"), ("middle school", "junior high"),
    ("high school", "secondary"), ("vocational", "associate", "college"), ("bachelor",),
    ("master", "mba"), ("ph.d", "phd", "doctor"),
)
# Numeric attributes with at most this many distinct values get one group per value.
MAX_EXACT_NUMERIC = 8
NUMERIC_BINS = 5


# --- helpers --------------------------------------------------------------------------
def _has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return bool(con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND database_name = current_database()",
        [name]).fetchone()[0])


def _db_name(con: duckdb.DuckDBPyConnection) -> str:
    row = con.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()
    return str(row[0]) if row and row[0] else "the database"


def known_runs(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every run id recorded (runs table, plus any run with round results), newest first."""
    if not _has_table(con, "runs"):
        return []
    parts = ["SELECT run_id, started_at FROM runs"]
    if _has_table(con, "rounds"):
        parts.append("SELECT DISTINCT run_id, NULL::TIMESTAMP FROM rounds")
    rows = con.execute(
        f"SELECT run_id, max(started_at) s FROM ({' UNION ALL '.join(parts)}) GROUP BY run_id "
        "ORDER BY s DESC NULLS LAST, run_id").fetchall()
    return [r[0] for r in rows]


def _check_runs(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> list[str]:
    if isinstance(run_ids, str):
        run_ids = [run_ids]
    run_ids = list(dict.fromkeys(run_ids))
    if not run_ids:
        raise AnalysisError("no run ids given")
    known = known_runs(con)
    known_set = set(known)
    for rid in run_ids:
        if rid not in known_set:
            shown = ", ".join(known[:10]) + (f", … ({len(known)} in all)" if len(known) > 10 else "")
            raise AnalysisError(f"run {rid!r} is not in {_db_name(con)}; known runs: {shown or '(none)'}")
    return run_ids


def _loads(text: str | None) -> dict | None:
    if text is None:
        return None
    if isinstance(text, dict):
        return text
    try:
        out = json.loads(text)
    except (TypeError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def _rows(cur: duckdb.DuckDBPyConnection) -> list[dict]:
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def _num(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


# --- run header -----------------------------------------------------------------------
def run_info(con: duckdb.DuckDBPyConnection, run_id: str) -> dict:
    """The run's header: ``run_id, name, status, reason, started_at, finished_at, hosts,
    agents, rounds, seed, ratio`` (as written, e.g. "2/3")``, offset, max_value, model``
    (dict)``, prompt`` (dict or None)``, population`` (dict or None)``, equilibrium,
    config`` (the whole RunConfig as a dict)``, manifest`` (dict or None)."""
    _check_runs(con, [run_id])
    row = _rows(con.execute("SELECT * FROM runs WHERE run_id = ?", [run_id]))
    r = row[0] if row else {"run_id": run_id}
    cfg = _loads(r.get("config_json")) or {}
    game = cfg.get("game") or {}
    ratio = str(game.get("ratio", "2/3"))
    offset = float(game.get("offset", 0.0) or 0.0)
    max_value = float(game.get("max_value", 100.0) or 100.0)
    try:
        eq = equilibrium(ratio, offset, max_value)
    except AnalysisError:
        eq = None
    prompt = cfg.get("prompt")
    population = cfg.get("population")
    return {
        "run_id": run_id,
        "name": cfg.get("name"),
        "status": r.get("status"),
        "reason": r.get("reason"),
        "started_at": r.get("started_at"),
        "finished_at": r.get("finished_at"),
        "hosts": list(r.get("hosts") or []),
        "agents": cfg.get("agents"),
        "rounds": cfg.get("rounds"),
        "seed": cfg.get("seed"),
        "ratio": ratio,
        "offset": offset,
        "max_value": max_value,
        "model": cfg.get("model") if isinstance(cfg.get("model"), dict) else {},
        "prompt": prompt if isinstance(prompt, dict) else ({"variant": prompt} if prompt else None),
        "population": population if isinstance(population, dict) else (
            {"source": population} if population else None),
        "equilibrium": eq,
        "config": cfg,
        "manifest": _loads(r.get("manifest_json")),
    }


def last_round(con: duckdb.DuckDBPyConnection, run_id: str) -> int | None:
    """The run's last closed round (rounds table), else the last round with guesses."""
    row = con.execute("SELECT max(round) FROM rounds WHERE run_id = ?", [run_id]).fetchone()
    if row and row[0] is not None:
        return int(row[0])
    row = con.execute("SELECT max(round) FROM guesses WHERE run_id = ?", [run_id]).fetchone()
    return int(row[0]) if row and row[0] is not None else None


# --- per round ------------------------------------------------------------------------
def round_table(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict]:
    """One dict per round (ascending): ``round, n, n_valid, n_invalid, mean, median, std,
    min, max, target, winner_agent_id, winner_value, n_winners``.

    n/n_valid and the statistics come from the recorded guesses (std: sample, None for
    n_valid < 2); target and winner from the environment's round result (None while a round
    is not closed). A round with results but no recorded guesses falls back to the result's
    n, n_valid and mean."""
    _check_runs(con, [run_id])
    cur = con.execute(
        """
        WITH g AS (
            SELECT round, count(*) AS n,
                   count(*) FILTER (WHERE valid AND value IS NOT NULL) AS n_valid,
                   avg(value) FILTER (WHERE valid) AS mean,
                   quantile_cont(value, 0.5) FILTER (WHERE valid) AS median,
                   stddev_samp(value) FILTER (WHERE valid) AS std,
                   min(value) FILTER (WHERE valid) AS min,
                   max(value) FILTER (WHERE valid) AS max
            FROM guesses WHERE run_id = $1 GROUP BY round
        ), r AS (
            SELECT round, any_value(n) AS n, any_value(n_valid) AS n_valid, any_value(mean) AS mean,
                   any_value(target) AS target, any_value(winner_agent_id) AS winner_agent_id,
                   any_value(winner_value) AS winner_value, any_value(n_winners) AS n_winners
            FROM rounds WHERE run_id = $1 GROUP BY round
        )
        SELECT coalesce(g.round, r.round) AS round,
               coalesce(g.n, r.n, 0) AS n,
               coalesce(g.n_valid, r.n_valid, 0) AS n_valid,
               coalesce(g.mean, r.mean) AS mean,
               g.median, g.std, g.min, g.max,
               r.target, r.winner_agent_id, r.winner_value, r.n_winners
        FROM g FULL OUTER JOIN r ON g.round = r.round
        ORDER BY round
        """, [run_id])
    out = []
    for row in _rows(cur):
        out.append({
            "round": int(row["round"]),
            "n": int(row["n"]),
            "n_valid": int(row["n_valid"]),
            "n_invalid": int(row["n"]) - int(row["n_valid"]),
            "mean": _num(row["mean"]),
            "median": _num(row["median"]),
            "std": _num(row["std"]),
            "min": _num(row["min"]),
            "max": _num(row["max"]),
            "target": _num(row["target"]),
            "winner_agent_id": None if row["winner_agent_id"] is None else int(row["winner_agent_id"]),
            "winner_value": _num(row["winner_value"]),
            "n_winners": None if row["n_winners"] is None else int(row["n_winners"]),
        })
    return out


def guesses(con: duckdb.DuckDBPyConnection, run_id: str, round: int | None = None) -> dict[int, np.ndarray]:
    """The valid guesses of a run (or of one round) as ``{round: float array}``."""
    _check_runs(con, [run_id])
    sql = "SELECT round, value FROM guesses WHERE run_id = ? AND valid AND value IS NOT NULL"
    params: list = [run_id]
    if round is not None:
        sql += " AND round = ?"
        params.append(round)
    data = con.execute(sql + " ORDER BY round", params).fetchnumpy()
    rounds = np.asarray(data["round"])
    values = np.asarray(data["value"], dtype=float)
    return {int(r): values[rounds == r] for r in np.unique(rounds)}


def invalid_answers(con: duckdb.DuckDBPyConnection, run_id: str, limit: int = 5) -> dict:
    """``{"count": invalid answers in the run, "examples": [{"round", "agent_id", "raw"}, …]}``
    (up to ``limit`` examples, earliest first; raw texts as recorded, not escaped)."""
    _check_runs(con, [run_id])
    count = con.execute("SELECT count(*) FROM guesses WHERE run_id = ? AND NOT coalesce(valid, false)",
                        [run_id]).fetchone()[0]
    ex = _rows(con.execute(
        "SELECT round, agent_id, raw FROM guesses WHERE run_id = ? AND NOT coalesce(valid, false) "
        "ORDER BY round, agent_id LIMIT ?", [run_id, int(limit)]))
    return {"count": int(count), "examples": ex}


# --- attributes and grouping ----------------------------------------------------------
def _keys_in(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str], column: str) -> list[str]:
    if not _has_table(con, "agent_profiles"):
        return []
    rows = con.execute(
        f"SELECT json_keys({column}) AS k, min(agent_id) AS first FROM agent_profiles "
        f"WHERE run_id IN (SELECT unnest($1)) AND json_type({column}) = 'OBJECT' "
        "GROUP BY k ORDER BY first", [list(run_ids)]).fetchall()
    seen: dict[str, None] = {}
    for keys, _ in rows:
        for k in keys or []:
            seen.setdefault(k, None)
    return list(seen)


def attributes(con: duckdb.DuckDBPyConnection, run_id: str) -> list[str]:
    """The profile attribute names present in the run (as sampled from the population config,
    e.g. ``["education", "age", "gender"]``), in the order the first profile lists them;
    ``[]`` for a run without a population."""
    _check_runs(con, [run_id])
    return _keys_in(con, [run_id], "profile")


def group_attributes(con: duckdb.DuckDBPyConnection, run_id: str | Sequence[str]) -> list[str]:
    """Everything ``group_table`` accepts as ``by``: profile attributes, then the persona's
    own fields (name, gender, age, description, …) not already in the profile."""
    run_ids = _check_runs(con, [run_id] if isinstance(run_id, str) else run_id)
    out = dict.fromkeys(_keys_in(con, run_ids, "profile"))
    out.update(dict.fromkeys(_keys_in(con, run_ids, "persona")))
    return list(out)


def _json_path(key: str) -> str:
    return '$."' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _fmt_num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _age_label(x: float) -> tuple[str, float]:
    """An age → ("18-29", sort key)."""
    if x < AGE_EDGES[0]:
        return f"under {AGE_EDGES[0]}", -1.0
    for lo, hi in pairwise(AGE_EDGES):
        if x < hi:
            return f"{lo}-{hi - 1}", float(lo)
    return f"{AGE_EDGES[-1]}+", float(AGE_EDGES[-1])


def _education_rank(label: str) -> int | None:
    low = label.lower()
    for rank, keys in enumerate(EDUCATION_LADDER):
        if any(k in low for k in keys):
            return rank
    return None


def _labels_for(by: str, raw_values: list) -> tuple[dict, list[str]]:
    """Map each distinct parsed attribute value to a group label, and order the labels.

    Strings and booleans are their own groups. Numbers: ``age``-like attributes in decade bins
    (18-29, 30-39, …, 80+); other numeric attributes with few distinct values one group each,
    else five equal-width bins. Missing → "(none)", always last."""
    present = [v for v in raw_values if v is not None]
    mapping: dict = {}
    keys: dict[str, tuple] = {}
    numeric = bool(present) and all(_is_number(v) for v in present)
    name = by.lower()
    if numeric and (name == "age" or name.startswith("age_") or name.endswith("_age")):
        for v in present:
            label, k = _age_label(float(v))
            mapping[v] = label
            keys[label] = (0, k, label)
    elif numeric and len(set(present)) <= MAX_EXACT_NUMERIC:
        for v in present:
            label = _fmt_num(float(v))
            mapping[v] = label
            keys[label] = (0, float(v), label)
    elif numeric:
        arr = np.array([float(v) for v in present])
        lo, hi = float(arr.min()), float(arr.max())
        integer = all(float(v).is_integer() for v in present)
        edges = np.linspace(lo, hi, NUMERIC_BINS + 1)
        if integer:
            edges = np.unique(np.round(edges))
        for v in present:
            i = min(int(np.searchsorted(edges, float(v), side="right")) - 1, len(edges) - 2)
            a, b = edges[i], edges[i + 1]
            last = i == len(edges) - 2
            if integer:
                label = f"{_fmt_num(a)}-{_fmt_num(b if last else b - 1)}"
            else:
                label = f"{a:.3g}-{b:.3g}"
            mapping[v] = label
            keys[label] = (0, float(a), label)
    else:
        def text(v) -> str:
            if isinstance(v, str):
                return v
            return json.dumps(v, ensure_ascii=False)
        labels = {v if not isinstance(v, (dict, list)) else json.dumps(v, sort_keys=True): text(v)
                  for v in present}
        ranks = {lab: _education_rank(lab) for lab in labels.values()}
        ordinal = "educ" in name and all(r is not None for r in ranks.values())
        for v, lab in labels.items():
            mapping[v] = lab
            keys[lab] = (0, ranks[lab] if ordinal else 0, lab.lower(), lab)
    mapping[None] = NONE_GROUP
    keys.setdefault(NONE_GROUP, (1,))
    order = sorted(keys, key=lambda lab: keys[lab])
    return mapping, order


def _parse_attr(text: str | None):
    if text is None:
        return None
    try:
        v = json.loads(text)
    except ValueError:
        return text
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def group_table(con: duckdb.DuckDBPyConnection, run_ids: str | Sequence[str], by: str,
                round: int | None = None, level: float = LEVEL) -> list[dict]:
    """Mean guess per group of attribute ``by`` (looked up in each agent's profile, then its
    persona), over the valid guesses of one round of each run (``round=None``: each run's
    last round).

    One dict per group, in a sensible order (education levels by rank, ages by bin, others
    alphabetically; "(none)" — agents without the attribute — last)::

        group        label, e.g. "Ph.D." or "30-39"
        n            agents with a valid guess, pooled over the runs
        mean, median, std        over those agents (std: sample)
        ci_low, ci_high          95% Student-t CI of the mean across agents (None for n < 2)
        n_runs       runs in which the group has at least one valid guess
        run_means    {run_id: the group's mean in that run}        (None for a single run)
        seed_mean    mean of run_means                              (None for a single run)
        seed_ci_low, seed_ci_high  95% Student-t CI across runs (seeds)  (None for a single run
                     or a group seen in fewer than 2 runs)

    Raises AnalysisError for an unknown run, an attribute no agent has, or a round a run
    does not have."""
    run_ids = _check_runs(con, [run_ids] if isinstance(run_ids, str) else run_ids)
    available = group_attributes(con, run_ids)
    if by not in available:
        raise AnalysisError(
            f"attribute {by!r} is not in the profiles of run(s) {', '.join(run_ids)}; "
            f"available: {', '.join(available) if available else '(none: these runs have no population)'}")
    picks: list[tuple[str, int]] = []
    for rid in run_ids:
        r = round if round is not None else last_round(con, rid)
        if r is None:
            continue  # a run without any guess contributes nothing
        if round is not None:
            have = [x[0] for x in con.execute(
                "SELECT DISTINCT round FROM guesses WHERE run_id = ? ORDER BY 1", [rid]).fetchall()]
            if round not in have:
                span = f"rounds {have[0]}..{have[-1]}" if have else "no guesses"
                raise AnalysisError(f"round {round} is not in run {rid!r} ({span})")
        picks.append((rid, int(r)))
    path = _json_path(by)
    run_col: list[np.ndarray] = []
    val_col: list[np.ndarray] = []
    attr_col: list[np.ndarray] = []
    for rid, r in picks:
        data = con.execute(
            """
            SELECT g.value,
                   CAST(coalesce(json_extract(p.profile, $3), json_extract(p.persona, $3)) AS VARCHAR) AS attr
            FROM guesses g
            LEFT JOIN (SELECT agent_id, any_value(profile) AS profile, any_value(persona) AS persona
                       FROM agent_profiles WHERE run_id = $1 GROUP BY agent_id) p
              ON p.agent_id = g.agent_id
            WHERE g.run_id = $1 AND g.round = $2 AND g.valid AND g.value IS NOT NULL
            """, [rid, r, path]).fetchnumpy()
        vals = np.asarray(data["value"], dtype=float)
        attrs = np.asarray(data["attr"], dtype=object)
        run_col.append(np.full(vals.size, rid, dtype=object))
        val_col.append(vals)
        attr_col.append(attrs)
    values = np.concatenate(val_col) if val_col else np.empty(0)
    runs = np.concatenate(run_col) if run_col else np.empty(0, dtype=object)
    attrs = np.concatenate(attr_col) if attr_col else np.empty(0, dtype=object)
    # JSON 'null' and missing keys both mean "no attribute"
    attrs = np.array([None if a is None or a == "null" else a for a in attrs], dtype=object)
    distinct = list(dict.fromkeys(a for a in attrs if a is not None))
    parsed = {t: _parse_attr(t) for t in distinct}
    hashable = {t: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v)
                for t, v in parsed.items()}
    mapping, order = _labels_for(by, list(hashable.values()))
    labels = np.array([NONE_GROUP if a is None else mapping[hashable[a]] for a in attrs], dtype=object)
    multi = len(run_ids) > 1
    out = []
    for lab in order:
        sel = labels == lab
        if not sel.any():
            continue
        v = values[sel]
        s = summary(v)
        ci = mean_ci(v, level)
        row = {
            "group": lab, "n": s["n"], "mean": s["mean"], "ci_low": ci["low"], "ci_high": ci["high"],
            "median": s["median"], "std": s["std"],
            "n_runs": len(set(runs[sel])),
            "run_means": None, "seed_mean": None, "seed_ci_low": None, "seed_ci_high": None,
        }
        if multi:
            rm = {rid: float(values[sel & (runs == rid)].mean())
                  for rid in run_ids if (sel & (runs == rid)).any()}
            sci = mean_ci(list(rm.values()), level)
            row.update(run_means=rm, seed_mean=sci["mean"], seed_ci_low=sci["low"], seed_ci_high=sci["high"])
        out.append(row)
    return out


# --- convergence ----------------------------------------------------------------------
def convergence_table(con: duckdb.DuckDBPyConnection, run_ids: str | Sequence[str]) -> list[dict]:
    """One dict per run and round: ``run_id, round, mean, median, target, winner_value,
    equilibrium, distance`` where distance = |mean − equilibrium| (None when the game has no
    unique equilibrium or the round no valid guess)."""
    run_ids = _check_runs(con, [run_ids] if isinstance(run_ids, str) else run_ids)
    out = []
    for rid in run_ids:
        eq = run_info(con, rid)["equilibrium"]
        for r in round_table(con, rid):
            dist = abs(r["mean"] - eq) if (eq is not None and r["mean"] is not None) else None
            out.append({"run_id": rid, "round": r["round"], "mean": r["mean"], "median": r["median"],
                        "target": r["target"], "winner_value": r["winner_value"],
                        "equilibrium": eq, "distance": dist})
    return out


__all__ = [
    "AGE_EDGES", "NONE_GROUP", "attributes", "convergence_table", "group_attributes", "group_table",
    "guesses", "invalid_answers", "known_runs", "last_round", "round_table", "run_info",
]
