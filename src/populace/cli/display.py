"""Rich output shared by demo, run and results: live progress and the per-round table."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from populace.client.progress import RunProgress, fmt, summary_text  # noqa: F401 - re-exported for the CLI
from populace.core.contracts import RoundResult

console = Console(stderr=True)
# Piped or captured output keeps whole tables (rich would squeeze them into 80 columns).
out = Console(width=None if sys.stdout.isatty() else 200)


def summary_labels(summary_model) -> dict[str, str]:
    """Column labels of a simulation's round summary: each field's title, else its name."""
    return {name: f.title or name.replace("_", " ") for name, f in summary_model.model_fields.items()}


def round_rows(results: list[RoundResult]) -> list[dict]:
    """Round results as rows: round, n, n_valid and the simulation's summary columns."""
    return [{"round": r.round, "n": r.n, "n_valid": r.n_valid, **r.summary}
            for r in sorted(results, key=lambda r: r.round)]


def rounds_table(rows: list[dict], labels: dict[str, str], title: str) -> Table:
    """A run's rounds as they closed: valid answers and the simulation's summary columns."""
    t = Table(title=title)
    for col in ("round", "valid", *labels.values()):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["round"]), f"{r['n_valid']}/{r['n']}", *(fmt(r.get(k)) for k in labels))
    return t


def stats_table(rows: list[dict], title: str) -> Table:
    """The analysis' per-round table: counts, spread, target and winner."""
    t = Table(title=title)
    for col in ("round", "valid", "mean", "median", "std", "min", "max", "target", "winner", "winning number"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["round"]), f"{r['n_valid']}/{r['n']}", fmt(r["mean"]), fmt(r["median"]), fmt(r["std"]),
                  fmt(r["min"], 1), fmt(r["max"], 1), fmt(r["target"]),
                  "—" if r["winner_agent_id"] is None else str(r["winner_agent_id"]), fmt(r["winner_value"], 1))
    return t


def _ci(low: float | None, high: float | None) -> str:
    return "—" if low is None or high is None else f"[{fmt(low)}, {fmt(high)}]"


def group_table(rows: list[dict], by: str, title: str, across_runs: bool) -> Table:
    """Mean per group with a 95% CI across agents and, for several runs, across runs (seeds)."""
    t = Table(title=title)
    t.add_column(by)
    for col in ("agents", "mean", "95% CI (agents)", "median", "std"):
        t.add_column(col, justify="right")
    if across_runs:
        for col in ("runs", "mean of run means", "95% CI (runs)"):
            t.add_column(col, justify="right")
    for r in rows:
        cells = [str(r["group"]), str(r["n"]), fmt(r["mean"]), _ci(r["ci_low"], r["ci_high"]),
                 fmt(r["median"]), fmt(r["std"])]
        if across_runs:
            cells += [str(r["n_runs"]), fmt(r["seed_mean"]), _ci(r["seed_ci_low"], r["seed_ci_high"])]
        t.add_row(*cells)
    return t


def rerun_table(before: list[dict], after: dict[int, RoundResult], labels: dict[str, str], old_id: str,
                new_id: str) -> Table:
    """The original run's rounds next to the rerun's: valid answers and the first summary
    columns side by side, and whether every summary column is identical."""
    shown = list(labels)[:2]
    t = Table(title=f"rerun {new_id} of {old_id}")
    for col in ("round", "valid (run)", "valid (rerun)",
                *(f"{labels[k]} ({w})" for k in shown for w in ("run", "rerun")), "same"):
        t.add_column(col, justify="right")
    for b in before:
        a = after.get(b["round"])
        same = a is not None and a.n_valid == b["n_valid"] and all(a.summary.get(k) == b.get(k) for k in labels)
        t.add_row(str(b["round"]), str(b["n_valid"]), str(a.n_valid) if a else "—",
                  *(fmt(v) for k in shown for v in (b.get(k), a.summary.get(k) if a else None)),
                  "yes" if same else "no")
    return t



