"""The measure per group of a profile or persona attribute (``group_table``), with confidence
intervals across agents and across runs; what one can group by; how values become groups."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from itertools import pairwise

import duckdb
import numpy as np

from populace.analysis.queries.lookup import _check_runs, _has_table, _last_round, last_round, tables_of
from populace.analysis.stats import AnalysisError, mean_ci, share_ci, t_interval
from populace.analysis.tables import RunTables, q, run_tables
from populace.store.sql_parts import _measure_expr, _need_measure, _num, _option_expr, _options, _run

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
    if MODEL not in out and _has_models(con, run_ids):
        out[MODEL] = None  # a run with `models:`: each agent's model (table agent_models)
    return list(out)


# `by` naming this groups agents by their model (a run with `models:`), not by a profile attribute
MODEL = "model"


def _has_models(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> bool:
    return _has_table(con, "agent_models") and con.execute(
        "SELECT count(*) > 0 FROM agent_models WHERE run_id IN (SELECT unnest($1))", [list(run_ids)]).fetchone()[0]


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


def _same_tables(rts: list[RunTables]) -> RunTables:
    first = rts[0]
    for rt in rts[1:]:
        if (rt.spec.outcomes, rt.measure, rt.kind) != (first.spec.outcomes, first.measure, first.kind):
            raise AnalysisError(
                f"runs {first.run_id!r} and {rt.run_id!r} cannot be compared: {first.run_id} records "
                f"{first.measure!r} in {first.spec.outcomes!r} ({first.spec.simulation}), {rt.run_id} records "
                f"{rt.measure!r} in {rt.spec.outcomes!r} ({rt.spec.simulation})")
    return first


def _picks(con: duckdb.DuckDBPyConnection, rts: list[RunTables], round: int | None) -> list[tuple[str, int]]:
    """(run, round) to compare: the given round (checked) or each run's last."""
    picks = []
    for rt in rts:
        if round is not None:
            have = [x[0] for x in con.execute(
                f"SELECT DISTINCT round FROM {q(rt.spec.outcomes)} WHERE run_id = ? ORDER BY 1",
                [rt.run_id]).fetchall()]
            if round not in have:
                span = f"rounds {have[0]}..{have[-1]}" if have else f"no {rt.nouns}"
                raise AnalysisError(f"round {round} is not in run {rt.run_id!r} ({span})")
            picks.append((rt.run_id, int(round)))
        else:
            r = _last_round(con, rt)
            if r is not None:  # a run without any outcome contributes nothing
                picks.append((rt.run_id, r))
    return picks


def _grouped_base(rt: RunTables, value_expr: str, by_model: bool = False) -> str:
    """SQL (a CTE body) of the valid answers of the picked (run, round)s with the attribute's
    JSON text (`by_model`: the agent's model): columns run_id, attr, v. Binds $runs, $rounds, $path."""
    if by_model:
        return f"""
        SELECT o.run_id, CAST(to_json(m.model) AS VARCHAR) AS attr, {value_expr} AS v
        FROM {q(rt.spec.outcomes)} o
        JOIN (SELECT unnest($runs) AS run_id, unnest($rounds) AS round) k
          ON o.run_id = k.run_id AND o.round = k.round
        LEFT JOIN agent_models m ON m.run_id = o.run_id AND m.agent_id = o.agent_id
        WHERE o.valid AND o.{q(rt.measure)} IS NOT NULL AND $path IS NOT NULL"""
    return f"""
        SELECT o.run_id,
               CAST(coalesce(json_extract(p.profile, $path), json_extract(p.persona, $path)) AS VARCHAR) AS attr,
               {value_expr} AS v
        FROM {q(rt.spec.outcomes)} o
        JOIN (SELECT unnest($runs) AS run_id, unnest($rounds) AS round) k
          ON o.run_id = k.run_id AND o.round = k.round
        LEFT JOIN (SELECT run_id, agent_id, any_value(profile) AS profile, any_value(persona) AS persona
                   FROM agent_profiles WHERE run_id IN (SELECT unnest($runs)) GROUP BY run_id, agent_id) p
          ON p.run_id = o.run_id AND p.agent_id = o.agent_id
        WHERE o.valid AND o.{q(rt.measure)} IS NOT NULL"""


def group_points(con: duckdb.DuckDBPyConnection, run_id: str, by: str, round_: int | None = None
                 ) -> dict[str, list[float]]:
    """``{group label: [value, …]}`` of a numeric measure in one round (default: the last),
    labelled as ``group_table(con, run_id, by)`` labels its groups (the same helpers, so a figure's
    points and its table cannot disagree): what a figure shows of a small group beside its mean."""
    rt = tables_of(con, run_id)
    round_ = last_round(con, run_id) if round_ is None else round_
    if round_ is None or rt.kind != "numeric":
        return {}
    params = {"runs": [run_id], "rounds": [round_], "path": _json_path(by)}
    by_model = by == MODEL and _has_models(con, [run_id])
    rows = _run(con, f"{_grouped_base(rt, 'o.' + q(rt.measure), by_model)} ORDER BY o.agent_id", params).fetchall()
    texts = {attr for _, attr, _ in rows if attr is not None and attr != "null"}
    parsed = {t: _parse_attr(t) for t in texts}
    hashable = {t: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v) for t, v in parsed.items()}
    mapping, order = _labels_for(by, list(hashable.values()))
    out: dict[str, list[float]] = {label: [] for label in order}
    for _, attr, value in rows:
        label = mapping[hashable[attr]] if attr in hashable else NONE_GROUP
        out.setdefault(label, []).append(float(value))
    return {label: values for label, values in out.items() if values}


def group_table(con: duckdb.DuckDBPyConnection, run_ids: str | Sequence[str], by: str,
                round: int | None = None, level: float = LEVEL) -> list[dict]:
    """The measure per group of attribute ``by`` (looked up in each agent's profile, then its
    persona), over the valid answers of one round of each run (``round=None``: each run's last
    round). Groups come in a sensible order (education levels by rank, ages by bin, others
    alphabetically; "(none)" — agents without the attribute — last).

    Numeric measure: one dict per group::

        group        label, e.g. "Ph.D." or "30-39"
        n            agents with a valid answer, pooled over the runs
        mean, median, std        over those agents (std: sample)
        ci_low, ci_high          95% Student-t CI of the mean across agents (None for n < 2)
        n_runs       runs in which the group has at least one valid answer
        run_means    {run_id: the group's mean in that run}        (None for a single run)
        seed_mean    mean of run_means                              (None for a single run)
        seed_ci_low, seed_ci_high  95% Student-t CI across runs (seeds)  (None for a single run
                     or a group seen in fewer than 2 runs)

    Categorical measure: one dict per group and option (every option for every group, zeros
    included)::

        group, option
        n            the group's valid answers, pooled over the runs
        count        of them, this option
        share, ci_low, ci_high   count / n with its 95% Wilson score interval
        n_runs, run_shares, seed_mean, seed_ci_low, seed_ci_high
                     as above, for the option's share in each run (Student-t across runs,
                     cut to [0, 1])

    Raises AnalysisError for an unknown run, an attribute no agent has, a round a run does not
    have, or runs that record different measures."""
    run_ids = _check_runs(con, [run_ids] if isinstance(run_ids, str) else run_ids)
    rts = [run_tables(con, rid) for rid in run_ids]
    rt = _same_tables(rts)
    _need_measure(rt)
    available = group_attributes(con, run_ids)
    if by not in available:
        raise AnalysisError(
            f"attribute {by!r} is not in the profiles of run(s) {', '.join(run_ids)}; "
            f"available: {', '.join(available) if available else '(none: these runs have no population)'}")
    picks = _picks(con, rts, round)
    if not picks:
        return []
    params = {"runs": [p[0] for p in picks], "rounds": [p[1] for p in picks], "path": _json_path(by)}
    # 1. the attribute's distinct values (few), labelled in Python (bins, ranks) …
    if rt.kind == "categorical":
        # options in the order of the runs' round tables (frequency over every round), so colours
        # and columns stay the same from table to table
        options = _options(con, f"SELECT {_measure_expr(rt, 'o')} AS v FROM {q(rt.spec.outcomes)} o "
                                f"WHERE list_contains($runs, o.run_id) AND o.valid AND o.{q(rt.measure)} IS NOT NULL",
                           params, rt.spec.measure_options)
        params["opts"] = options
        value = _option_expr(rt, options)
    else:
        options = []
        value = f"o.{q(rt.measure)}"
    base = _grouped_base(rt, value, by == MODEL and _has_models(con, run_ids))
    distinct = [r[0] for r in _run(con, f"WITH b AS ({base}) SELECT DISTINCT attr FROM b", params).fetchall()]
    present = [a for a in distinct if a is not None and a != "null"]  # JSON null: no attribute
    parsed = {t: _parse_attr(t) for t in present}
    hashable = {t: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v) for t, v in parsed.items()}
    mapping, order = _labels_for(by, list(hashable.values()))
    # 2. … and the labels handed back to DuckDB, which aggregates per label (and run)
    params["attrs"] = present
    params["labels"] = [mapping[hashable[t]] for t in present]
    labelled = f"""
        WITH b AS ({base}),
             lab AS (SELECT unnest($attrs) AS attr, unnest($labels) AS label),
             x AS (SELECT b.run_id, coalesce(lab.label, '{NONE_GROUP}') AS label, b.v
                   FROM b LEFT JOIN lab ON b.attr = lab.attr)"""
    multi = len(run_ids) > 1
    if rt.kind == "numeric":
        return _numeric_groups(con, labelled, params, order, run_ids, multi, level)
    return _categorical_groups(con, labelled, params, order, options, run_ids, multi, level)


def _numeric_groups(con, labelled: str, params: dict, order: list[str], run_ids: list[str], multi: bool,
                    level: float) -> list[dict]:
    rows = _run(con,
        f"""{labelled}
        SELECT label, run_id, grouping(run_id) AS pooled, count(v) AS n, avg(v) AS mean,
               quantile_cont(v, 0.5) AS median, stddev_samp(v) AS std
        FROM x GROUP BY GROUPING SETS ((label), (label, run_id))""", params).fetchall()
    pooled = {r[0]: r for r in rows if r[2]}
    per_run: dict[str, dict[str, float]] = {}
    for label, rid, is_pooled, n, mean, _, _ in rows:
        if not is_pooled and n:
            per_run.setdefault(label, {})[rid] = float(mean)
    out = []
    for lab in order:
        if lab not in pooled:
            continue
        _, _, _, n, mean, median, std = pooled[lab]
        n, mean, median, std = int(n), _num(mean), _num(median), _num(std)
        low, high = t_interval(mean, std, n, level)
        row = {"group": lab, "n": n, "mean": mean, "ci_low": low, "ci_high": high, "median": median, "std": std,
               "n_runs": len(per_run.get(lab, {})),
               "run_means": None, "seed_mean": None, "seed_ci_low": None, "seed_ci_high": None}
        if multi:
            rm = {rid: per_run[lab][rid] for rid in run_ids if rid in per_run.get(lab, {})}
            sci = mean_ci(list(rm.values()), level)
            row.update(run_means=rm, seed_mean=sci["mean"], seed_ci_low=sci["low"], seed_ci_high=sci["high"])
        out.append(row)
    return out


def _categorical_groups(con, labelled: str, params: dict, order: list[str], options: list[str],
                        run_ids: list[str], multi: bool, level: float) -> list[dict]:
    rows = _run(con,
        f"""{labelled}
        SELECT label, run_id, v, grouping(run_id) AS pooled, count(*) AS c
        FROM x GROUP BY GROUPING SETS ((label, v), (label, run_id, v))""", params).fetchall()
    pooled: dict[str, dict[str, int]] = {}
    per_run: dict[str, dict[str, dict[str, int]]] = {}
    for label, rid, opt, is_pooled, c in rows:
        if is_pooled:
            pooled.setdefault(label, {})[opt] = int(c)
        else:
            per_run.setdefault(label, {}).setdefault(rid, {})[opt] = int(c)
    out = []
    for lab in order:
        if lab not in pooled:
            continue
        n = sum(pooled[lab].values())
        runs = per_run.get(lab, {})
        for opt in options:
            k = pooled[lab].get(opt, 0)
            ci = share_ci(k, n, level)
            row = {"group": lab, "option": opt, "n": n, "count": k, "share": ci["share"],
                   "ci_low": ci["low"], "ci_high": ci["high"], "n_runs": len(runs),
                   "run_shares": None, "seed_mean": None, "seed_ci_low": None, "seed_ci_high": None}
            if multi:
                # each run (seed) is one replicate: the share's mean across runs and its t interval
                rs = {rid: runs[rid].get(opt, 0) / sum(runs[rid].values()) for rid in run_ids if rid in runs}
                sci = mean_ci(list(rs.values()), level)
                # with few runs the t interval easily passes 0 or 1 (2 runs: t = 12.7); a share cannot,
                # so the interval is cut to [0, 1]
                low = None if sci["low"] is None else max(0.0, sci["low"])
                high = None if sci["high"] is None else min(1.0, sci["high"])
                row.update(run_shares=rs, seed_mean=sci["mean"], seed_ci_low=low, seed_ci_high=high)
            out.append(row)
    return out
