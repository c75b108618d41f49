"""Interviews' answers (table `interviews`, what each survey asked in `interview_questions`):
per question the answer distribution overall and per persona group, across agents and, with
several runs (replicates), across runs; panels over rounds; free text searched; their LLM work
apart from the rounds'.

- ``interview_questions(con, run_ids)``: what was asked (survey, question, kind, text, options,
  scale, range; the rounds it was asked after; planned, or the post-hoc request).
- ``interview_table(con, run_ids, by=None, after_round=None)``: per question and group, each
  option's share with a Wilson 95% interval (options), or the mean with a Student-t 95% interval
  (Likert, number), or the count and a few answers (free text); with several runs, the same
  across runs (each run one replicate).
- ``panel_table(con, run_ids, by=None)``: a question asked after several rounds, per round and
  group: the mean (Likert, number) or each option's share — lines over rounds.
- ``search_answers(con, run_id, words)``: answers (and raw texts) containing every word.
- ``interview_usage(con, run_id)``: the interviews' LLM calls and tokens, apart.

Aggregates come from DuckDB (a panel of a million agents is a few million rows); only one row
per question, round, group and option comes back to Python.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import duckdb

from populace.analysis.queries.attribute_groups import (
    LEVEL,
    NONE_GROUP,
    _json_path,
    _labels_for,
    _parse_attr,
    group_attributes,
)
from populace.analysis.queries.lookup import _check_runs, _has_table
from populace.analysis.stats import AnalysisError, mean_ci, share_ci, t_interval
from populace.store.interview_tables import SCHEMA

MAX_EXAMPLES = 3  # free-text answers shown per question and group
# SCHEMA: the tables, as the recorder creates them (and a local run's answers are loaded into),
# defined in populace.store.interview_tables so the recorder need not load scipy.


def local_database(run_id: str, config_json: str, rows: dict[str, list], surveys: Sequence[tuple[int, object]],
                   profiles: Sequence[dict] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory database with a local run's answers laid out as the recorder lays them
    out (`rows`: table `interviews`'s columns; `surveys`: (after round, Survey) asked;
    `profiles`: each agent's profile), for the same analysis as a recorded run."""
    import pyarrow as pa

    con = duckdb.connect()
    con.execute(SCHEMA)
    con.execute("CREATE TABLE runs (run_id VARCHAR, started_at TIMESTAMP, finished_at TIMESTAMP, config_json JSON, "
                "status VARCHAR, reason VARCHAR, hosts VARCHAR[], manifest_json JSON, simulation VARCHAR, "
                "tables_json JSON)")
    con.execute("CREATE TABLE agent_profiles (run_id VARCHAR, agent_id BIGINT, persona_index BIGINT, profile JSON, "
                "persona JSON)")
    con.execute("INSERT INTO runs (run_id, started_at, config_json, status) VALUES (?, now(), ?, 'completed')",
                [run_id, config_json])
    n = len(rows.get("agent_id", []))
    table = {k: rows[k] for k in ("run_id", "after_round", "survey", "question", "agent_id", "answer", "value", "raw",
                                  "valid", "error", "latency_ms")}
    table["request"] = rows.get("request", [None] * n)
    table["host_id"] = ["local"] * n
    con.register("local_rows", pa.Table.from_pydict(table))
    con.execute("INSERT INTO interviews BY NAME SELECT * FROM local_rows")
    con.unregister("local_rows")
    for after_round, survey in surveys:
        for i, q in enumerate(survey.questions):  # type: ignore[attr-defined]
            con.execute("INSERT INTO interview_questions VALUES (?, ?, ?, NULL, ?, ?, ?, ?, ?, ?)",
                        [run_id, after_round, survey.id, survey.mode, i, q.id, q.kind, q.text,  # type: ignore[attr-defined]
                         json.dumps(q.model_dump(mode="json", exclude_none=True))])
    if profiles:
        con.executemany("INSERT INTO agent_profiles VALUES (?, ?, ?, ?, NULL)",
                        [(run_id, i, i, json.dumps(p)) for i, p in enumerate(profiles)])
    return con


def has_interviews(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> bool:
    if not _has_table(con, "interviews"):
        return False
    return bool(con.execute("SELECT count(*) FROM interviews WHERE run_id IN (SELECT unnest($1))",
                            [list(run_ids)]).fetchone()[0])


def interview_questions(con: duckdb.DuckDBPyConnection, run_ids: str | Sequence[str],
                        request: str | None = None) -> list[dict]:
    """One dict per question asked in the runs (or by one post-hoc `request`), in the order
    asked: ``survey, question, kind, text, spec`` (its definition), ``rounds`` (after which it
    was asked), ``requests`` (post-hoc ids; empty: planned), ``mode``."""
    run_ids = _check_runs(con, [run_ids] if isinstance(run_ids, str) else run_ids)
    if not _has_table(con, "interview_questions"):
        return []
    rows = con.execute(
        "SELECT survey, question, any_value(kind), any_value(text), any_value(spec), any_value(mode), "
        "list(DISTINCT after_round ORDER BY after_round), list(DISTINCT request) FILTER (WHERE request IS NOT NULL), "
        "min(after_round), min(position) "
        "FROM interview_questions WHERE run_id IN (SELECT unnest($1)) AND position >= 0 "
        "AND ($2 IS NULL OR request = $2) "
        "GROUP BY survey, question ORDER BY min(after_round), survey, min(position)", [run_ids, request]).fetchall()
    return [{"survey": s, "question": qid, "kind": kind, "text": text, "spec": json.loads(spec), "mode": mode,
             "rounds": list(rounds), "requests": sorted(requests or [])}
            for s, qid, kind, text, spec, mode, rounds, requests, _, _ in rows]


def _labels(con: duckdb.DuckDBPyConnection, run_ids: list[str], by: str | None) -> tuple[str, dict, list[str]]:
    """SQL (a CTE body: run_id, agent_id, label) of each answering agent's group, its params,
    and the groups' order."""
    if by is None:
        return ("SELECT DISTINCT run_id, agent_id, 'all' AS label FROM interviews "
                "WHERE run_id IN (SELECT unnest($runs))"), {}, ["all"]
    available = group_attributes(con, run_ids)
    if by not in available:
        raise AnalysisError(f"attribute {by!r} is not in the profiles of run(s) {', '.join(run_ids)}; "
                            f"available: {', '.join(available) if available else '(none: no population)'}")
    params = {"path": _json_path(by)}
    attrs = """SELECT run_id, agent_id, CAST(coalesce(json_extract(any_value(profile), $path),
                                                   json_extract(any_value(persona), $path)) AS VARCHAR) AS attr
               FROM agent_profiles WHERE run_id IN (SELECT unnest($runs)) GROUP BY run_id, agent_id"""
    distinct = [r[0] for r in con.execute(f"SELECT DISTINCT attr FROM ({attrs})", {**params, "runs": run_ids})
                .fetchall()]
    present = [a for a in distinct if a is not None and a != "null"]
    parsed = {t: _parse_attr(t) for t in present}
    hashable = {t: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v) for t, v in parsed.items()}
    mapping, order = _labels_for(by, list(hashable.values()))
    params.update(attrs=present, labels=[mapping[hashable[t]] for t in present])
    sql = f"""SELECT i.run_id, i.agent_id, coalesce(lab.label, '{NONE_GROUP}') AS label
              FROM (SELECT DISTINCT run_id, agent_id FROM interviews WHERE run_id IN (SELECT unnest($runs))) i
              LEFT JOIN ({attrs}) a ON a.run_id = i.run_id AND a.agent_id = i.agent_id
              LEFT JOIN (SELECT unnest($attrs) AS attr, unnest($labels) AS label) lab ON lab.attr = a.attr"""
    return sql, params, order


def _group_order(order: list[str], found: set[str]) -> list[str]:
    return [g for g in order if g in found] + sorted(found - set(order))


def interview_table(con: duckdb.DuckDBPyConnection, run_ids: str | Sequence[str], *, by: str | None = None,
                    after_round: int | None = None, survey: str | None = None, request: str | None = None,
                    level: float = LEVEL) -> list[dict]:
    """Per question (each after its last round asked, or `after_round`) and group ("all"
    without `by`), over the valid answers:

    - options (and Likert, whose points are its options): one dict per option with ``n`` (valid
      answers), ``count``, ``share``, ``ci_low``, ``ci_high`` (Wilson); Likert and number also
      one dict (option None) with ``mean``, ``ci_low``, ``ci_high`` (Student-t), ``std``;
    - text: one dict with ``n`` and ``examples``;
    - every dict: ``survey, question, kind, text, after_round, group, n_asked, n_valid`` and,
      with several runs, ``run_values`` (each run's share or mean), ``seed_mean``,
      ``seed_ci_low``, ``seed_ci_high`` (Student-t across runs; shares cut to [0, 1]).
    """
    run_ids = _check_runs(con, [run_ids] if isinstance(run_ids, str) else run_ids)
    questions = [q for q in interview_questions(con, run_ids, request)
                 if survey is None or q["survey"] == survey]
    if not questions:
        return []
    labels, params, order = _labels(con, run_ids, by)
    params["runs"] = run_ids
    multi = len(run_ids) > 1
    out: list[dict] = []
    for qd in questions:
        rounds = qd["rounds"]
        if after_round is not None and after_round not in rounds:
            continue
        k = after_round if after_round is not None else rounds[-1]
        p = {**params, "survey": qd["survey"], "question": qd["question"], "round": k, "request": request}
        base = f"""WITH g AS ({labels})
                   SELECT i.run_id, g.label, i.valid, i.answer, i.value FROM interviews i
                   JOIN g ON g.run_id = i.run_id AND g.agent_id = i.agent_id
                   WHERE i.run_id IN (SELECT unnest($runs)) AND i.survey = $survey AND i.question = $question
                     AND i.after_round = $round AND ($request IS NULL OR i.request = $request)"""
        counts = con.execute(f"""WITH b AS ({base})
            SELECT label, run_id, count(*) AS asked, count(*) FILTER (WHERE valid) AS valid,
                   avg(value) FILTER (WHERE valid) AS mean, stddev_samp(value) FILTER (WHERE valid) AS std
            FROM b GROUP BY GROUPING SETS ((label), (label, run_id))""", p).fetchall()
        pooled = {r[0]: r for r in counts if r[1] is None}
        per_run: dict[str, dict[str, tuple]] = {}
        for r in counts:
            if r[1] is not None:
                per_run.setdefault(r[0], {})[r[1]] = r
        head = {"survey": qd["survey"], "question": qd["question"], "kind": qd["kind"], "text": qd["text"],
                "after_round": k}
        groups = _group_order(order, set(pooled))
        if qd["kind"] in ("options", "likert"):
            options = qd["spec"].get("options") or [str(i) for i in range(1, (qd["spec"].get("points") or 0) + 1)]
            rows = con.execute(f"""WITH b AS ({base})
                SELECT label, run_id, answer, count(*) FROM b WHERE valid
                GROUP BY GROUPING SETS ((label, answer), (label, run_id, answer))""", p).fetchall()
            got: dict[tuple, int] = {(lab, rid, a): int(c) for lab, rid, a, c in rows}
            for g in groups:
                _, _, asked, n, *_ = pooled[g]
                for option in options:
                    ci = share_ci(got.get((g, None, option), 0), int(n), level)
                    row = {**head, "group": g, "option": option, "n_asked": int(asked), "n_valid": int(n), "n": int(n),
                           "count": ci["k"], "share": ci["share"], "ci_low": ci["low"], "ci_high": ci["high"]}
                    if multi:
                        values = {rid: got.get((g, rid, option), 0) / r[3] for rid, r in per_run.get(g, {}).items()
                                  if r[3]}
                        row.update(_across(values, level, share=True))
                    out.append(row)
        if qd["kind"] in ("likert", "number"):
            for g in groups:
                _, _, asked, n, mean, std = pooled[g]
                low, high = t_interval(mean, std, int(n), level)
                row = {**head, "group": g, "option": None, "n_asked": int(asked), "n_valid": int(n), "n": int(n),
                       "mean": mean, "std": std, "ci_low": low, "ci_high": high}
                if multi:
                    row.update(_across({rid: r[4] for rid, r in per_run.get(g, {}).items() if r[4] is not None},
                                       level))
                out.append(row)
        if qd["kind"] == "text":
            examples = con.execute(f"""WITH b AS ({base})
                SELECT label, list(answer ORDER BY answer)[1:{MAX_EXAMPLES}] FROM b WHERE valid GROUP BY label""",
                                   p).fetchall()
            ex = {lab: list(xs) for lab, xs in examples}
            for g in groups:
                _, _, asked, n, *_ = pooled[g]
                out.append({**head, "group": g, "option": None, "n_asked": int(asked), "n_valid": int(n),
                            "n": int(n), "examples": ex.get(g, [])})
    return out


def _across(values: dict[str, float], level: float, share: bool = False) -> dict:
    """Each run one replicate: the mean of the runs' values with a Student-t interval."""
    ci = mean_ci(list(values.values()), level)
    low, high = ci["low"], ci["high"]
    if share:  # with few runs the t interval easily passes 0 or 1, which a share cannot
        low = None if low is None else max(0.0, low)
        high = None if high is None else min(1.0, high)
    return {"run_values": values, "seed_mean": ci["mean"], "seed_ci_low": low, "seed_ci_high": high}


def panel_table(con: duckdb.DuckDBPyConnection, run_ids: str | Sequence[str], *, by: str | None = None,
                level: float = LEVEL) -> list[dict]:
    """Questions asked after more than one round (panels), per round and group: the mean with
    its interval (Likert, number) or each option's share (options): ``survey, question, kind,
    text, after_round, group, option, n, mean | share, ci_low, ci_high``."""
    run_ids = _check_runs(con, [run_ids] if isinstance(run_ids, str) else run_ids)
    out: list[dict] = []
    for qd in interview_questions(con, run_ids):
        if len(qd["rounds"]) < 2 or qd["kind"] == "text":
            continue
        for k in qd["rounds"]:
            out.extend(r for r in interview_table(con, run_ids, by=by, after_round=k, survey=qd["survey"], level=level)
                       if r["question"] == qd["question"] and (qd["kind"] == "options" or r["option"] is None))
    return out


def search_answers(con: duckdb.DuckDBPyConnection, run_id: str, words: Sequence[str] = (),
                   limit: int = 50) -> list[dict]:
    """Answers whose text (or raw text) holds every word, any case: ``after_round, survey,
    question, agent_id, answer, raw, valid``; free text first."""
    _check_runs(con, [run_id])
    if not _has_table(con, "interviews"):
        return []
    where = ["run_id = $run"]
    params: dict = {"run": run_id, "limit": int(limit)}
    for i, w in enumerate(words):
        where.append(f"(answer ILIKE $w{i} OR raw ILIKE $w{i})")
        params[f"w{i}"] = f"%{w}%"
    cur = con.execute(f"SELECT after_round, survey, question, agent_id, answer, raw, valid FROM interviews "
                      f"WHERE {' AND '.join(where)} ORDER BY value IS NOT NULL, after_round, survey, question, "
                      "agent_id LIMIT $limit", params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def interview_usage(con: duckdb.DuckDBPyConnection, run_id: str) -> dict | None:
    """The interviews' LLM work in a run, apart from its rounds': ``answers, valid, llm_calls,
    prompt_tokens, completion_tokens, infra_retries, cached_tokens, dollars`` (None: no interview)."""
    if not _has_table(con, "interviews"):
        return None
    answers, valid = con.execute("SELECT count(*), count(*) FILTER (WHERE valid) FROM interviews WHERE run_id = ?",
                                 [run_id]).fetchone()
    if not answers:
        return None
    used = (0, 0, 0, 0, 0, 0.0)
    if _has_table(con, "interview_usage"):
        # a file from before interviews' cached tokens and dollars were recorded has no such columns
        have = {r[0] for r in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = "
                                          "'interview_usage' AND database_name = current_database()").fetchall()}
        cost = ", ".join(f"coalesce(sum({c}), 0)" if c in have else "0" for c in ("cached_tokens", "dollars"))
        used = con.execute("SELECT coalesce(sum(llm_calls), 0), coalesce(sum(prompt_tokens), 0), "
                           f"coalesce(sum(completion_tokens), 0), coalesce(sum(infra_retries), 0), {cost} "
                           "FROM interview_usage WHERE run_id = ?", [run_id]).fetchone()
    return {"answers": int(answers), "valid": int(valid), "llm_calls": int(used[0]), "prompt_tokens": int(used[1]),
            "completion_tokens": int(used[2]), "infra_retries": int(used[3]), "cached_tokens": int(used[4]),
            "dollars": float(used[5])}
