"""Live progress of a run (rich: a terminal, or a notebook): agents spawned, then one bar per
round, advanced by the hosts' progress ticks and closed with the round's summary."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from populace.core.contracts import HostSpawned, RoundOpen, RoundResult, RunConfig
from populace.core.contracts import Progress as ProgressTick


def fmt(x: object, digits: int = 2) -> str:
    """A table cell: numbers to `digits`, a mapping as `key value · key value` (e.g. a vote's
    counts), a list comma-separated, None as a dash."""
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    if isinstance(x, dict):
        return " · ".join(f"{k} {fmt(v, digits)}" for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return ", ".join(fmt(v, digits) for v in x)
    return str(x)


def summary_text(summary: dict, limit: int = 2) -> str:
    """The first few numbers of a round's summary, e.g. 'mean 50.68, target 33.79'."""
    shown = [f"{k.replace('_', ' ')} {fmt(v)}" for k, v in summary.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)][:limit]
    return ", ".join(shown)


class RunProgress:
    def __init__(self, config: RunConfig, enabled: bool = True, console: Console | None = None) -> None:
        self.config = config
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console or Console(stderr=True),
                                 disable=not enabled, transient=False)
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
            p.update(self.rounds[model.round], completed=model.n,
                     description=f"round {model.round}: {summary_text(model.summary)}".rstrip(": "))
