"""The public-goods game's parameters: the scenario's `game:` and `prompt:` sections."""

from __future__ import annotations

from fractions import Fraction
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from populace.sdk import Count, FiniteFloat, Params

# Rounds an agent remembers (its own contribution, payoff and its group's average each);
# `game.history_window` shows at most this many in the prompt.
MEMORY_ROUNDS = 10
# Chain of thought needs room to think: the answer budget when `model.max_tokens` is not set.
COT_MAX_TOKENS = 256


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GameConfig(_Section):
    """Each round every agent gets `endowment` tokens and puts a whole number of them, 0 to
    `endowment`, into its group's pot; the pot is multiplied by `multiplier` and shared
    equally by the group's members: payoff = endowment − contribution + multiplier · pot / k,
    k the group's actual size (groups are consecutive agent ids; the last may be smaller)."""

    group_size: Count = Field(5, ge=2, le=1_000_000)
    endowment: Count = Field(20, ge=1, le=1_000_000)
    multiplier: FiniteFloat = Field(1.6, gt=0, le=1_000_000)
    history_window: Count = Field(5, ge=0, le=MEMORY_ROUNDS)  # past rounds shown in the prompt

    @property
    def multiplier_fraction(self) -> Fraction:
        """The multiplier as the decimal the scenario wrote (1.6 → 8/5, not the nearest binary
        float), so payoffs and their sums are computed exactly."""
        return Fraction(repr(self.multiplier))


class PromptConfig(_Section):
    """The system prompt (shared by every agent, so replicas cache it) states the rules, an
    optional note on the population's make-up and the answer instruction; the user prompt
    carries the agent's persona, its own past rounds and the request."""

    # direct: give the contribution at once; cot: think step by step first (chain of thought),
    # still one structured call: {"reasoning": ..., "contribution": ...}.
    answer: Literal["direct", "cot"] = "direct"
    persona: bool = True  # put the agent's persona background in its prompt (needs a population)
    population_note: bool = False  # tell every agent the population's make-up (needs a population)


class PublicGoodsParams(Params):
    game: GameConfig = GameConfig()
    prompt: PromptConfig = PromptConfig()
