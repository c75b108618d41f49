"""Live progress of a run (rich: a terminal, or a notebook): agents spawned, then one bar per
round, advanced by the hosts' progress ticks and closed with the round's summary; for a run on
priced models, the dollars spent so far and their projection to the last round, updated as each
round closes (from the round results, never per call)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from populace.client.estimate import projected
from populace.core.contracts import HostSpawned, RoundOpen, RoundResult, RunConfig, Usage, money
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


class Spending:
    """A run's dollars as its rounds close: what was spent before this view began (`spent`
    over `rounds_done` rounds: a resumed run's), plus each round's result (its rounds' and
    interviews' dollars, by round: a round decided again counts once)."""

    def __init__(self, rounds: int, spent: float = 0.0, rounds_done: int = 0) -> None:
        self.rounds, self.before, self.before_rounds = rounds, spent, rounds_done
        self.by_round: dict[int, float] = {}

    def add(self, result: RoundResult) -> None:
        if result.round > self.before_rounds:
            self.by_round[result.round] = result.usage.dollars + result.interviews.dollars

    @property
    def spent(self) -> float:
        return self.before + sum(self.by_round.values())

    @property
    def done(self) -> int:
        return self.before_rounds + len(self.by_round)

    def text(self) -> str:
        """'dollars: $0.42 spent, ~$1.05 by round 5' ('…, projected after the first round' before one)."""
        ahead = projected(self.spent, self.done, self.rounds)
        end = "projected after the first round" if ahead is None else f"~{money(ahead)} by round {self.rounds}"
        return f"dollars: {money(self.spent)} spent, {end}"


class RunProgress:
    def __init__(self, config: RunConfig, enabled: bool = True, console: Console | None = None,
                 spent: Usage | None = None, rounds_done: int = 0) -> None:
        self.config = config
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console or Console(stderr=True),
                                 disable=not enabled, transient=False)
        self.spawn = self.progress.add_task("spawning agents", total=config.agents)
        self.rounds: dict[int, int] = {}
        # a run on priced models: its dollars, one line (its bar: the rounds done)
        self.spending = Spending(config.rounds, spent.dollars if spent else 0.0, rounds_done)
        self.cost = (self.progress.add_task(self.spending.text(), total=config.rounds, completed=rounds_done)
                     if any(not m.prices.free for m in config.models) else None)

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
        elif isinstance(model, RoundResult):
            if model.round in self.rounds:
                p.update(self.rounds[model.round], completed=model.n,
                         description=f"round {model.round}: {summary_text(model.summary)}".rstrip(": "))
            if self.cost is not None:
                self.spending.add(model)
                p.update(self.cost, completed=min(self.spending.done, self.config.rounds),
                         description=self.spending.text())
