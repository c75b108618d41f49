"""The answers themselves, for reading: every invalid answer with its raw text, and each agent's
valid answers with the chain of thought the model wrote before it (``{"reasoning": …}``).

Both are capped so a report of a million agents stays a file one can open: the invalid answers
up to MAX_INVALID_ROWS (earliest first), the valid ones of the first agents by id up to
MAX_ANSWER_ROWS rows; the report says how many there are in all."""

from __future__ import annotations

import json
from dataclasses import dataclass

import duckdb

from populace.analysis.queries import tables_of
from populace.analysis.report.text import number, shortened
from populace.analysis.tables import has_table, q, table_columns

MAX_INVALID_ROWS = 2000
MAX_ANSWER_ROWS = 1000
MAX_RAW_CHARS = 2000  # a raw answer past this is shortened (SmolLM2's 256 tokens are ~1,000 characters)
PAGE_SIZE = 50  # rows per page of a paged table (paged in the browser)


@dataclass(frozen=True)
class AnswerRows:
    """Rows to show of a larger set: ``rows`` (dicts), ``total`` in the run, and a note when
    only some of them are shown."""

    rows: list[dict]
    total: int
    note: str | None

    @property
    def pages(self) -> int:
        return page_count(len(self.rows))


def page_count(n_rows: int, size: int = PAGE_SIZE) -> int:
    """Pages of ``size`` rows needed for ``n_rows`` (at least one, for the empty page)."""
    return max(1, -(-n_rows // size))


def shown_note(shown: int, total: int, what: str, how: str) -> str | None:
    """'Showing the first 2,000 of 5,120 invalid answers (…).' when not all are shown."""
    if shown >= total:
        return None
    return f"Showing the {how} {shown:,} of {total:,} {what}, to keep this file small."


def reasoning_of(raw: str | None) -> str | None:
    """The chain of thought in a structured answer (``{"reasoning": "…", "guess": 12}``, also
    with text around the JSON), or None when the answer has none."""
    if not raw:
        return None
    for text in (raw, raw[raw.find("{"): raw.rfind("}") + 1]):
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("reasoning"), str):
            return value["reasoning"]
    return None


def profile_text(profile: str | None) -> str:
    """'education: Ph.D., age: 34' from an agent's profile JSON ('' without one)."""
    try:
        value = json.loads(profile) if profile else None
    except ValueError:
        return str(profile)
    if not isinstance(value, dict):
        return ""
    return ", ".join(f"{k}: {v}" for k, v in value.items())


def invalid_rows(con: duckdb.DuckDBPyConnection, run_id: str, limit: int = MAX_INVALID_ROWS) -> AnswerRows:
    """The run's invalid answers, earliest first: ``round, agent_id, raw, error``."""
    rt = tables_of(con, run_id)
    t = q(rt.spec.outcomes)
    total = con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ? AND NOT coalesce(valid, false)",
                        [run_id]).fetchone()[0]
    error = "error" if "error" in table_columns(con, rt.spec.outcomes) else "NULL"
    rows = con.execute(
        f"SELECT round, agent_id, raw, {error} FROM {t} WHERE run_id = ? AND NOT coalesce(valid, false) "
        "ORDER BY round, agent_id LIMIT ?", [run_id, int(limit)]).fetchall()
    shown = [{"round": r, "agent_id": a, "raw": shortened(raw, MAX_RAW_CHARS), "error": err or ""}
             for r, a, raw, err in rows]
    return AnswerRows(shown, int(total), shown_note(len(shown), int(total), "invalid answers", "first"))


def answer_rows(con: duckdb.DuckDBPyConnection, run_id: str, limit: int = MAX_ANSWER_ROWS) -> AnswerRows:
    """Each agent's valid answers, by agent then round: ``agent_id, round, answer, reasoning``
    (the chain of thought, else the raw text), ``has_reasoning`` and ``profile``; the first
    agents by id whose answers fit in ``limit`` rows (an agent's rounds are never split)."""
    rt = tables_of(con, run_id)
    t = q(rt.spec.outcomes)
    answer = f"CAST(o.{q(rt.measure)} AS VARCHAR)" if rt.measure else "NULL"
    n_agents, n_rows = con.execute(f"SELECT count(DISTINCT agent_id), count(*) FROM {t} WHERE run_id = ? AND valid",
                                   [run_id]).fetchone()
    per_agent = max(1, -(-int(n_rows) // max(1, int(n_agents))))
    agents = max(1, limit // per_agent)
    profiles = has_table(con, "agent_profiles")
    profile_join = ("LEFT JOIN (SELECT agent_id, any_value(CAST(profile AS VARCHAR)) AS profile FROM agent_profiles "
                    "WHERE run_id = $run GROUP BY agent_id) p USING (agent_id)") if profiles else ""
    rows = con.execute(
        f"""WITH first AS (SELECT DISTINCT agent_id FROM {t} WHERE run_id = $run AND valid
                           ORDER BY agent_id LIMIT $agents)
            SELECT o.agent_id, o.round, {answer}, o.raw,
                   {'p.profile' if profiles else 'NULL'}
            FROM {t} o JOIN first USING (agent_id) {profile_join}
            WHERE o.run_id = $run AND o.valid ORDER BY o.agent_id, o.round""",
        {"run": run_id, "agents": agents}).fetchall()
    shown = []
    for agent, round_, value, raw, profile in rows:
        reasoning = reasoning_of(raw)
        shown.append({"agent_id": agent, "round": round_, "answer": "—" if value is None else number(_parsed(value)),
                      "reasoning": shortened(reasoning if reasoning is not None else raw, MAX_RAW_CHARS),
                      "has_reasoning": reasoning is not None, "profile": profile_text(profile)})
    shown_agents = len({r["agent_id"] for r in shown})
    note = shown_note(shown_agents, int(n_agents), "agents with a valid answer", "first")
    return AnswerRows(shown, int(n_rows), note)


def _parsed(value: str) -> object:
    """A measure's text as a number when it is one (formatted like the tables), else the text."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value
