"""A prototype run's approximation in the report (docs/prototypes.md): per round and prototype,
who called the model and who copied, the audits, the draws' divergence from them with its 95%
interval, and the guard's share for the next round."""

from __future__ import annotations

import duckdb

from populace.analysis.prototypes import prototype_summary, prototype_table
from populace.analysis.report.blocks import Note, Section, Table
from populace.analysis.report.text import interval, number, percent

MAX_ROWS = 200  # rounds × prototypes shown; the rest are in table prototype_rounds


def prototype_section(con: duckdb.DuckDBPyConnection, run_id: str) -> Section | None:
    """None for a run without prototypes."""
    summary = prototype_summary(con, run_id)
    if summary is None:
        return None
    rows = prototype_table(con, run_id)
    cells = [[number(r["round"]), r["prototype"], number(r["agents"]), number(r["share"], 4),
              f"{number(r['representatives'])} ({number(r['valid'])} valid)", number(r["drawn"]),
              number(r["unanswered"]), f"{number(r['audited_valid'])}/{number(r['audited'])}",
              f"{(r['metric'] or '').upper()} {number(r['divergence'], 3)}" if r["divergence"] is not None else "—",
              interval(r["ci_low"], r["ci_high"]),
              _guard(r)] for r in rows[:MAX_ROWS]]
    worst = summary["worst"]
    blocks = [
        Note(f"{number(summary['representatives'])} of {number(summary['outcomes'])} outcomes are the agents' own "
             f"calls, {number(summary['drawn'])} copied from their prototype's representatives; "
             f"{number(summary['audits'])} shadow audits; model calls {percent(summary['calls_share'])} of the "
             "outcomes" + (f"; the largest divergence {worst['metric'].upper()} {number(worst['divergence'], 3)} "
                           f"(95% CI {interval(worst['ci_low'], worst['ci_high'])}) in round {worst['round']}, "
                           f"{worst['prototype']}" if worst else "") + ".", tone="text"),
        Table(["round", "prototype", "agents", "share", "called", "copied", "no answer", "audited", "divergence",
               "95% CI", "guard"], cells, left=(1, 10)),
        Note("Divergence: the copied answers (each representative's, weighted by how many copied it) against the "
             "audited agents' real answers on copies of their state — Wasserstein-1 in the measure's units, or "
             "Jensen-Shannon (0–1) for a categorical one; the interval is a basic bootstrap over the audits. "
             "It measures the copies against this run's agents; a copied agent's memory does not change in the "
             "round (docs/prototypes.md)."),
    ]
    if len(rows) > MAX_ROWS:
        blocks.append(Note(f"The first {MAX_ROWS} of {len(rows)} rows; all are in table prototype_rounds.",
                           tone="warn"))
    return Section("Prototypes", blocks, anchor="prototypes")


def _guard(r: dict) -> str:
    if not r["breach"]:
        return ""
    return f"raised to {number(r['next_share'], 4)}" if r["next_share"] > r["share"] else "over the tolerance"


__all__ = ["prototype_section"]
