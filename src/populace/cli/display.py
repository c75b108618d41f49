"""Rich output shared by demo, run and results: live progress and the per-round table."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from populace.core.contracts import HostSpawned, Progress as ProgressTick, RoundOpen, RoundResult, RunConfig

console = Console(stderr=True)
# Piped or captured output keeps whole tables (rich would squeeze them into 80 columns).
out = Console(width=None if sys.stdout.isatty() else 200)


def fmt(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def rounds_table(rows: list[dict], title: str) -> Table:
    t = Table(title=title)
    for col in ("round", "valid", "mean", "target", "winner", "winning number"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["round"]), f"{r['n_valid']}/{r['n']}", fmt(r["mean"]), fmt(r["target"]),
                  "—" if r["winner_agent_id"] is None else str(r["winner_agent_id"]), fmt(r["winner_value"], 1))
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


def rerun_table(before: list[dict], after: dict, old_id: str, new_id: str) -> Table:
    """The original run's rounds next to the rerun's: mean, target and winner, and whether
    they are identical."""
    t = Table(title=f"rerun {new_id} of {old_id}")
    for col in ("round", "mean (run)", "mean (rerun)", "target (run)", "target (rerun)",
                "winner (run)", "winner (rerun)", "same"):
        t.add_column(col, justify="right")
    for b in before:
        a = after.get(b["round"])
        same = a is not None and (a.mean, a.target, a.winner_agent_id) == (b["mean"], b["target"], b["winner_agent_id"])
        t.add_row(str(b["round"]), fmt(b["mean"]), fmt(a.mean if a else None), fmt(b["target"]),
                  fmt(a.target if a else None), str(b["winner_agent_id"]),
                  str(a.winner_agent_id) if a else "—", "yes" if same else "no")
    return t


def result_row(r: RoundResult) -> dict:
    return dict(round=r.round, n_valid=r.n_valid, n=r.n, mean=r.mean, target=r.target,
                winner_agent_id=r.winner_agent_id, winner_value=r.winner_value)


class RunProgress:
    """Progress bars: agents spawned, then one bar per round (answers received)."""

    def __init__(self, config: RunConfig, enabled: bool = True) -> None:
        self.config = config
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, disable=not enabled,
                                 transient=False)
        self.spawn = self.progress.add_task("spawning agents", total=config.agents)
        self.rounds: dict[int, int] = {}

    def __enter__(self) -> RunProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def on_event(self, kind: str, model: object) -> None:
        p = self.progress
        if isinstance(model, HostSpawned):
            p.advance(self.spawn, model.agents)
        elif isinstance(model, RoundOpen):
            self.rounds[model.round] = p.add_task(f"round {model.round}", total=model.expected)
        elif isinstance(model, ProgressTick) and model.round in self.rounds:
            p.advance(self.rounds[model.round], model.answered)
        elif isinstance(model, RoundResult) and model.round in self.rounds:
            task = self.rounds[model.round]
            p.update(task, completed=model.n,
                     description=f"round {model.round}: mean {fmt(model.mean)} → target {fmt(model.target)}")
