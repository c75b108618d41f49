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


STATS = ("mean", "median", "std", "min", "max")
MAX_SHOWN_OPTIONS = 8  # a categorical measure's share columns in the terminal (all of them in --json)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _plain(x: object):
    """Data (an option the model chose, a persona attribute) as literal text: rich would read
    '[...]' in it as markup."""
    from rich.text import Text

    return Text(str(x))


def most_chosen(row: dict) -> str:
    """'no (48.0%)', 'tie (36.0%)' or '—': the leading option of a round, from its outcomes."""
    if row.get("leader_share") is None:
        return "—"
    return f"{row['leader'] if row['leader'] is not None else 'tie'} ({_pct(row['leader_share'])})"


def _summary_shown(rows: list[dict], labels: dict[str, str], skip: tuple[str, ...]) -> list[str]:
    """The summary columns worth a terminal column: not one the analysis computes itself (the
    ratio game's `mean`), not a JSON dict or list (the vote's counts: the shares show them)."""
    return [k for k in labels if k not in skip
            and not any(isinstance((r.get("summary") or {}).get(k), (dict, list)) for r in rows)]


def stats_table(rows: list[dict], title: str, info: dict | None = None) -> Table:
    """The analysis' per-round table (`populace.analysis.round_table`): valid answers, the
    measure's statistics (numeric) or each option's share and the leading option (categorical),
    then the simulation's summary columns by their titles (`run_info`'s labels)."""
    info = info or {}
    kind = info.get("measure_kind") or ("numeric" if rows and "mean" in rows[0] else None)
    labels = info.get("labels")
    if labels is None:
        labels = {k: k.replace("_", " ") for k in ((rows[0].get("summary") or {}) if rows else {})}
    summary = _summary_shown(rows, labels, STATS if kind == "numeric" else ())
    options = (rows[0].get("options") or [])[:MAX_SHOWN_OPTIONS] if rows and kind == "categorical" else []
    t = Table(title=title)
    heads = ["round", "valid"]
    if kind == "numeric":
        heads += list(STATS)
    elif kind == "categorical":
        heads += ["most chosen", *options]
    for col in (*heads, *(labels[k] for k in summary)):
        t.add_column(_plain(col), justify="right")
    for r in rows:
        cells = [str(r["round"]), f"{r['n_valid']}/{r['n']}"]
        if kind == "numeric":
            cells += [fmt(r["mean"]), fmt(r["median"]), fmt(r["std"]), fmt(r["min"], 1), fmt(r["max"], 1)]
        elif kind == "categorical":
            cells += [_plain(most_chosen(r)), *(_pct(r["shares"].get(o)) for o in options)]
        s = r.get("summary") or {}
        cells += [fmt(s.get(k)) for k in summary]
        t.add_row(*cells)
    if kind == "categorical" and rows and len(rows[0].get("options") or []) > len(options):
        t.caption = f"{len(rows[0]['options']) - len(options)} more option(s) in --json"
    return t


def _ci(low: float | None, high: float | None) -> str:
    return "—" if low is None or high is None else f"[{fmt(low)}, {fmt(high)}]"


def group_table(rows: list[dict], by: str, title: str, across_runs: bool) -> Table:
    """Per group (`populace.analysis.group_table`): a numeric measure's mean with a Student-t 95%
    CI across agents, or (rows with an `option`) each option's share with a Wilson 95% CI; and,
    for several runs, the same across runs (seeds)."""
    if rows and "option" in rows[0]:
        return _share_group_table(rows, by, title, across_runs)
    t = Table(title=title)
    t.add_column(_plain(by))
    for col in ("agents", "mean", "95% CI (agents)", "median", "std"):
        t.add_column(col, justify="right")
    if across_runs:
        for col in ("runs", "mean of run means", "95% CI (runs)"):
            t.add_column(col, justify="right")
    for r in rows:
        cells = [_plain(r["group"]), str(r["n"]), fmt(r["mean"]), _ci(r["ci_low"], r["ci_high"]),
                 fmt(r["median"]), fmt(r["std"])]
        if across_runs:
            cells += [str(r["n_runs"]), fmt(r["seed_mean"]), _ci(r["seed_ci_low"], r["seed_ci_high"])]
        t.add_row(*cells)
    return t


def _pct_ci(low: float | None, high: float | None) -> str:
    return "—" if low is None or high is None else f"[{_pct(low)}, {_pct(high)}]"


def _share_group_table(rows: list[dict], by: str, title: str, across_runs: bool) -> Table:
    t = Table(title=title)
    t.add_column(_plain(by))
    t.add_column("option")
    for col in ("answers", "share", "95% CI (Wilson)"):
        t.add_column(col, justify="right")
    if across_runs:
        for col in ("runs", "mean share of runs", "95% CI (runs)"):
            t.add_column(col, justify="right")
    for i, r in enumerate(rows):
        first = i == 0 or rows[i - 1]["group"] != r["group"]  # the group's name once, on its first option
        last = i == len(rows) - 1 or rows[i + 1]["group"] != r["group"]
        cells = [_plain(r["group"]) if first else "", _plain(r["option"]), f"{r['count']}/{r['n']}", _pct(r["share"]),
                 _pct_ci(r["ci_low"], r["ci_high"])]
        if across_runs:
            cells += [str(r["n_runs"]), _pct(r["seed_mean"]), _pct_ci(r["seed_ci_low"], r["seed_ci_high"])]
        t.add_row(*cells, end_section=last)
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



