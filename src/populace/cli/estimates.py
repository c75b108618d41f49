"""`populace run --estimate`'s output: the pilot, the run's expected calls, tokens, cached tokens
and dollars, per model with the wall time its declared limits need, and what the estimate
cannot see (populace.client.estimate does the arithmetic)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from populace.cli import display

if TYPE_CHECKING:
    from rich.table import Table

    from populace.client.estimate import Estimate
    from populace.core.contracts import RunConfig, Usage


def pilot_line(run_id: str, config: RunConfig, pilot_agents: int, used: Usage) -> str:
    """'pilot run R: 20 of 1,000 agents, round 1, model sim: 20 LLM calls, 2,400 tokens (…)'."""
    models = ", ".join(m.name for m in config.models) or config.model.backend
    cached = f", {used.cached_tokens:,} of the prompt tokens cached" if used.cached_tokens else ""
    cost = f"; {display.money(used.dollars)}" if used.dollars else ""
    noun = "models" if len(config.models) > 1 else "model"
    return (f"pilot run {run_id}: {pilot_agents:,} of {config.agents:,} agents, round 1, {noun} "
            f"{models}: {used.llm_calls:,} LLM calls, {used.tokens:,} tokens ({used.prompt_tokens:,} prompt, "
            f"{used.completion_tokens:,} completion{cached}){cost}")


def expected_line(est: Estimate, config: RunConfig) -> str:
    line = f"expected for {est.agents:,} agents × {est.rounds} rounds: {est.calls:,.0f} LLM calls"
    if not est.counted_tokens:
        return line + f"; the {config.model.backend} model reports no tokens"
    line += (f", {est.tokens:,.0f} tokens (95% interval {est.tokens_low:,.0f}–{est.tokens_high:,.0f}; "
             f"{est.tokens_per_call:,.1f} ± {est.tokens_per_call_sd:,.1f} tokens per call)")
    if est.cached_tokens:
        line += f", {est.cached_tokens:,.0f} of the prompt tokens cached"
    if est.priced:
        line += f", {display.money(est.dollars)} at the models' prices"
    return line


def models_table(est: Estimate) -> Table:
    """Per model: its agents, expected calls, tokens, cached tokens, dollars and the wall time its
    declared limits need (the binding one named)."""
    t = display.table(title="by model")
    for i, col in enumerate(("model", "agents", "LLM calls", "tokens", "cached tokens", "dollars",
                             "wall time at its limits")):
        t.add_column(col, justify="left" if i in (0, 6) else "right")
    for m in est.models:
        binding = m.binding
        pace = (f"{_duration(binding[1])} ({binding[0]} binds)" if binding is not None
                else "no limit declared")
        dollars = display.money(m.dollars) if m.priced else "no prices"
        t.add_row(m.name + (" *" if m.from_others else ""), f"{m.agents:,}", f"{m.calls:,.0f}",
                  f"{m.tokens:,.0f}", f"{m.cached_tokens:,.0f}", dollars, pace)
    return t


def time_lines(est: Estimate) -> list[str]:
    """The run's wall time under its models' limits, and which models have none."""
    lines = []
    if est.minutes is not None:
        slowest = max((m for m in est.models if m.binding is not None), key=lambda m: m.binding[1])
        lines.append(f"wall time: at least {_duration(est.minutes)} under the declared limits (model {slowest.name}: "
                     f"its {slowest.binding[0]} binds; the models are asked side by side)")
    if est.unlimited:
        names, several = ", ".join(est.unlimited), len(est.unlimited) > 1
        its = "their" if several else "its"
        lines.append(f"model{'s' * several} {names}: no requests_per_min or tokens_per_min declared, "
                     f"so {its} pace is {its} replicas' and the gateways' (not estimated"
                     + ("; the concurrency bound above is from the pilot's mean latency per call" if any(
                         m.minutes_concurrency is not None for m in est.models if m.name in est.unlimited) else "")
                     + ")")
    if any(m.minutes_concurrency is not None for m in est.models):
        lines.append("concurrency: the calls one gateway keeps in flight to a model (limits.concurrency) at the "
                      "pilot's mean latency per call; several gateways divide it")
    if any(m.from_others for m in est.models):
        lines.append("* no pilot agent had this model: its work per agent is the pilot's agents' overall, at its "
                     "prices (a larger --pilot samples every model)")
    return lines


def caveats(est: Estimate) -> str:
    text = ("from round 1's prompts only: later rounds' prompts carry history and are usually longer; the pilot's "
            "prompt cache started cold (a long run usually serves more from cache). ")
    if est.priced:
        return text + ("`budget: {dollars: N}` (or `{tokens: N}`) in the scenario pauses the run before it goes past "
                       "N; `populace resume RUN --budget-dollars M` raises it.")
    return text + "`budget: {tokens: N}` in the scenario pauses the run before it goes past N."


def _duration(minutes: float) -> str:
    from populace.client.estimate import duration

    return duration(minutes)
