"""The ratio game's parameters: the scenario's `game:` and `prompt:` sections."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from populace.sdk import Count, FiniteFloat, Params


def parse_ratio(value: object) -> Fraction:
    """'2/3', '0.5', 0.5 or 2 → Fraction; raises ValueError with a readable reason."""
    if isinstance(value, bool):
        raise ValueError("must be a number or a fraction string like '2/3'")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError("must be finite")
        frac = Fraction(value)  # exact: a tiny positive float stays positive
    elif isinstance(value, str):
        try:
            frac = Fraction(value.strip())
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"{value!r} is not a number or a fraction like '2/3'") from None
    else:
        raise ValueError("must be a number or a fraction string like '2/3'")
    if frac <= 0:
        raise ValueError("must be > 0")
    return frac


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GameConfig(_Section):
    """target = ratio · mean + offset; the closest guess wins."""

    ratio: str = "2/3"
    offset: FiniteFloat = 0.0
    max_value: FiniteFloat = Field(100.0, gt=0)
    history_window: Count = Field(5, ge=0, le=100)

    @field_validator("ratio", mode="before")
    @classmethod
    def _ratio(cls, v: object) -> str:
        parse_ratio(v)
        return str(v).strip()

    @property
    def ratio_fraction(self) -> Fraction:
        return parse_ratio(self.ratio)

    @property
    def ratio_value(self) -> float:
        return float(self.ratio_fraction)


class PromptConfig(_Section):
    """Which of the paper's prompt variants the agents get. The system prompt (shared by every
    agent, so replicas cache it) is the game's rules plus the `system` family's sentence plus
    an optional note on the population's make-up; the user prompt carries the agent's persona
    background, its memory of past rounds and the `answer` instruction."""

    # basic: the rules only; rational: "all players are rational"; strategies: "think about
    # what the others will guess"; variant: "this is a variant of the guess-2/3 game".
    system: Literal["basic", "rational", "strategies", "variant"] = "basic"
    # direct: report the number at once; cot: think step by step first (chain of thought),
    # still one structured call: {"reasoning": ..., "guess": ...}.
    answer: Literal["direct", "cot"] = "direct"
    persona: bool = True  # put the agent's persona background in its prompt (needs a population)
    population_note: bool = False  # tell every agent the population's make-up (needs a population)


# Chain of thought needs room to think: the answer budget when `model.max_tokens` is not set.
COT_MAX_TOKENS = 256


class RatioParams(Params):
    game: GameConfig = GameConfig()
    prompt: PromptConfig = PromptConfig()
