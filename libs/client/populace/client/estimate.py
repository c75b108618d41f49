"""What a run will cost, from a pilot: a small share of its agents plays its first round on
the same models, and its LLM work is scaled up: calls, tokens (prompt, cached, completion),
dollars per model at the models' prices, and the wall time the models' declared limits allow.
Pure arithmetic here; `populace run --estimate` plays the pilot. And, during a run, the
projection of its dollars to the end (`projected`), which the live view and the manager show.

The uncertainty is the pilot's sampling error of the mean tokens per call (a 95% interval
from the per-call spread the agent-hosts count), scaled to the whole run. It does not cover
what the pilot cannot see: later rounds' prompts carry history and are usually longer; the
pilot's prompt cache starts cold (a long run usually serves more of its prompts from cache,
which the cached-input price makes cheaper); a provider's latency under load."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from populace.core.contracts import ModelEndpoint, Usage

PILOT_SHARE = 0.01
PILOT_MIN_AGENTS = 20
Z95 = 1.96


def pilot_agents(agents: int, share: float = PILOT_SHARE, minimum: int = PILOT_MIN_AGENTS) -> int:
    """How many agents the pilot plays: `share` of them, at least `minimum`, at most all."""
    if not 0 < share <= 1:
        raise ValueError(f"--pilot: the pilot's share of the agents must be in (0, 1], got {share}")
    return min(agents, max(minimum, math.ceil(agents * share)))


@dataclass(frozen=True)
class ModelEstimate:
    """One model's part of the run: its LLM work scaled from the pilot's agents on it to the
    run's, its dollars, and the minutes its declared limits need for that work."""

    name: str
    agents: int  # the run's agents on this model
    pilot_agents: int  # the pilot's
    calls: float
    prompt_tokens: float
    cached_tokens: float
    completion_tokens: float
    dollars: float
    priced: bool  # the model has prices (else its dollars are 0 because nobody said what it costs)
    # no pilot agent had this model (a small share): its work per agent is the pilot's agents' overall
    from_others: bool = False
    # minutes the run's calls need at the declared limits (None: that limit is not declared)
    minutes_requests: float | None = None  # calls / requests_per_min
    minutes_tokens: float | None = None  # tokens / tokens_per_min
    # calls × the pilot's mean latency per call / concurrency (None: no latency measured)
    minutes_concurrency: float | None = None
    concurrency: int = 0

    @property
    def tokens(self) -> float:
        return self.prompt_tokens + self.completion_tokens

    @property
    def limited(self) -> bool:
        """Whether a requests- or tokens-per-minute limit is declared."""
        return self.minutes_requests is not None or self.minutes_tokens is not None

    @property
    def binding(self) -> tuple[str, float] | None:
        """What sets this model's pace and the minutes it takes: the slowest of its limits."""
        bounds = [(what, m) for what, m in (("requests per minute", self.minutes_requests),
                                            ("tokens per minute", self.minutes_tokens),
                                            (f"concurrency {self.concurrency}", self.minutes_concurrency))
                  if m is not None]
        return max(bounds, key=lambda b: b[1]) if bounds else None


@dataclass(frozen=True)
class Estimate:
    agents: int
    rounds: int
    pilot_agents: int
    pilot: Usage  # the pilot round's LLM work
    calls: float  # expected LLM calls of the whole run
    tokens: float  # expected tokens (prompt + completion)
    tokens_low: float  # 95% interval
    tokens_high: float
    tokens_per_call: float
    tokens_per_call_sd: float
    cached_tokens: float = 0.0  # of the prompt tokens, those the pilot's providers served from cache, scaled
    dollars: float = 0.0  # at the models' prices
    models: tuple[ModelEstimate, ...] = ()  # a run with `models:`: per model

    @property
    def counted_tokens(self) -> bool:
        """False when the model reports no tokens (the dummy model)."""
        return self.pilot.tokens > 0

    @property
    def priced(self) -> bool:
        return any(m.priced for m in self.models)

    @property
    def minutes(self) -> float | None:
        """The wall time the declared limits need at least (the models pace side by side: the
        slowest one's); None when no model has a limit or a measured latency."""
        bound = [b[1] for m in self.models if (b := m.binding) is not None]
        return max(bound) if bound else None

    @property
    def unlimited(self) -> list[str]:
        """The models with neither a requests- nor a tokens-per-minute limit declared."""
        return [m.name for m in self.models if not m.limited]


def extrapolate(agents: int, rounds: int, pilot_agents: int, pilot: Usage,
                models: Sequence[ModelEndpoint] = (), run_counts: Mapping[str, int] | None = None,
                pilot_counts: Mapping[str, int] | None = None,
                latency_s: Mapping[str, float] | None = None) -> Estimate:
    """Scale one pilot round of `pilot_agents` agents to `agents` × `rounds`. With `models`:
    each model's pilot work (`pilot.by_model`) scaled by its agents in the run over its agents in
    the pilot (`run_counts`, `pilot_counts`: the manifests' model counts; the pilot's agents are a
    share of each model's), priced at its prices, and timed at its declared limits
    (`latency_s`: the pilot's mean seconds per call, by model, for the concurrency bound)."""
    if pilot_agents < 1:
        raise ValueError("the pilot played no agent")
    n = pilot.llm_calls
    mean = pilot.tokens / n if n else 0.0
    # sample variance of tokens per call, from the sum of squares (clamped: rounding)
    var = max(0.0, pilot.tokens_sq / n - mean * mean) * n / (n - 1) if n > 1 else 0.0
    sd = math.sqrt(var)
    per_model = tuple(_model(m, pilot, pilot_agents, rounds, (run_counts or {}).get(m.name, 0),
                             (pilot_counts or {}).get(m.name, 0), (latency_s or {}).get(m.name))
                      for m in models)
    if per_model:
        calls = sum(m.calls for m in per_model)
        tokens = sum(m.tokens for m in per_model)
        cached = sum(m.cached_tokens for m in per_model)
        dollars = sum(m.dollars for m in per_model)
    else:
        scale = agents * rounds / pilot_agents
        calls, tokens, cached, dollars = n * scale, pilot.tokens * scale, pilot.cached_tokens * scale, 0.0
    half = Z95 * calls * sd / math.sqrt(n) if n else 0.0
    return Estimate(agents=agents, rounds=rounds, pilot_agents=pilot_agents, pilot=pilot, calls=calls,
                    tokens=tokens, tokens_low=max(0.0, tokens - half), tokens_high=tokens + half,
                    tokens_per_call=mean, tokens_per_call_sd=sd, cached_tokens=cached, dollars=dollars,
                    models=per_model)


def _model(m: ModelEndpoint, pilot: Usage, pilot_agents: int, rounds: int, agents: int, in_pilot: int,
           latency: float | None) -> ModelEstimate:
    use = pilot.by_model.get(m.name)
    from_others = in_pilot < 1 or use is None
    if from_others:  # per agent as the pilot's agents overall, at this model's prices
        scale = agents * rounds / pilot_agents
        calls, prompt, cached, completion = (pilot.llm_calls * scale, pilot.prompt_tokens * scale,
                                             pilot.cached_tokens * scale, pilot.completion_tokens * scale)
        dollars = m.prices.dollars(prompt, cached, completion)
    else:
        scale = agents * rounds / in_pilot
        calls, prompt, cached, completion = (use.llm_calls * scale, use.prompt_tokens * scale,
                                             use.cached_tokens * scale, use.completion_tokens * scale)
        dollars = use.dollars * scale
    limits = m.limits
    return ModelEstimate(
        name=m.name, agents=agents, pilot_agents=max(0, in_pilot), calls=calls, prompt_tokens=prompt,
        cached_tokens=cached, completion_tokens=completion, dollars=dollars, priced=not m.prices.free,
        from_others=from_others and agents > 0,
        minutes_requests=calls / limits.requests_per_min if limits.requests_per_min else None,
        minutes_tokens=(prompt + completion) / limits.tokens_per_min if limits.tokens_per_min else None,
        minutes_concurrency=calls * latency / limits.concurrency / 60 if latency is not None and calls else None,
        concurrency=limits.concurrency)


def projected(spent: float, rounds_done: int, rounds: int) -> float | None:
    """What a run will have spent by its last round at the pace of its rounds so far (spent /
    rounds done × rounds); None before a round is done."""
    if rounds_done < 1:
        return None
    return spent / rounds_done * max(rounds, rounds_done)


def duration(minutes: float) -> str:
    """'45 s', '12 min', '3 h 20 min', '2.5 days'."""
    if minutes < 1:
        return f"{max(1, round(minutes * 60))} s"
    if minutes < 60:
        return f"{minutes:.0f} min"
    if minutes < 48 * 60:
        hours, rest = divmod(round(minutes), 60)
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    return f"{minutes / 1440:.1f} days"
