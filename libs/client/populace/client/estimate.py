"""What a run will cost, from a pilot: a small share of its agents plays its first round on
the same model, and its LLM work is scaled up. Pure arithmetic here; `populace run --estimate`
plays the pilot.

The uncertainty is the pilot's sampling error of the mean tokens per call (a 95% interval
from the per-call spread the agent-hosts count), scaled to the whole run. It does not cover
what the pilot cannot see: later rounds' prompts carry history and are usually longer."""

from __future__ import annotations

import math
from dataclasses import dataclass

from populace.core.contracts import Usage

PILOT_SHARE = 0.01
PILOT_MIN_AGENTS = 20
Z95 = 1.96


def pilot_agents(agents: int, share: float = PILOT_SHARE, minimum: int = PILOT_MIN_AGENTS) -> int:
    """How many agents the pilot plays: `share` of them, at least `minimum`, at most all."""
    if not 0 < share <= 1:
        raise ValueError(f"--pilot: the pilot's share of the agents must be in (0, 1], got {share}")
    return min(agents, max(minimum, math.ceil(agents * share)))


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

    @property
    def counted_tokens(self) -> bool:
        """False when the model reports no tokens (the dummy model)."""
        return self.pilot.tokens > 0


def extrapolate(agents: int, rounds: int, pilot_agents: int, pilot: Usage) -> Estimate:
    """Scale one pilot round of `pilot_agents` agents to `agents` × `rounds`."""
    if pilot_agents < 1:
        raise ValueError("the pilot played no agent")
    n = pilot.llm_calls
    calls = n / pilot_agents * agents * rounds
    mean = pilot.tokens / n if n else 0.0
    # sample variance of tokens per call, from the sum of squares (clamped: rounding)
    var = max(0.0, pilot.tokens_sq / n - mean * mean) * n / (n - 1) if n > 1 else 0.0
    sd = math.sqrt(var)
    half = Z95 * calls * sd / math.sqrt(n) if n else 0.0
    tokens = calls * mean
    return Estimate(agents=agents, rounds=rounds, pilot_agents=pilot_agents, pilot=pilot, calls=calls,
                    tokens=tokens, tokens_low=max(0.0, tokens - half), tokens_high=tokens + half,
                    tokens_per_call=mean, tokens_per_call_sd=sd)
