"""The punishment game's parameters: the scenario's `game:` and `prompt:` sections."""

from __future__ import annotations

import string
from fractions import Fraction
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from populace.sdk import Count, FiniteFloat, Params

COT_MAX_TOKENS = 256  # chain of thought needs room to think
DIRECT_MAX_TOKENS = 48  # the platform's default `model.max_tokens`
TOKENS_PER_POINT_FIELD = 6  # `"A": 10, ` in a punishment answer
MEMORY_ROUNDS = 5  # past rounds an agent remembers (and sees in its prompt)
# A punishment answer has one field per other member, named by a letter (A, B, …): a group
# holds at most 27 members (26 others).
LABELS = string.ascii_uppercase
MAX_GROUP = len(LABELS) + 1


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GameConfig(_Section):
    """Every round, groups of `group_size` are drawn again within blocks of `block` agents
    (strangers). Stage 1: each member puts 0..`endowment` tokens into its group's pot, which is
    multiplied by `multiplier` and shared equally. Stage 2: each member, seeing the others'
    contributions, assigns each other member 0..`max_points` punishment points; a point costs its
    giver `cost` tokens and its target `fine` tokens. `max_points: 0` plays stage 1 alone (the
    game without punishment)."""

    group_size: Count = Field(4, ge=2, le=MAX_GROUP)
    # strangers: groups are drawn again every round within blocks of this many agents (placed
    # whole on one host); block == group_size keeps each group for the whole run (partners)
    block: Count = Field(100, ge=2, le=1_000_000)
    endowment: Count = Field(20, ge=1, le=1_000_000)
    multiplier: FiniteFloat = Field(1.6, gt=0, le=1_000_000)
    max_points: Count = Field(10, ge=0, le=1_000)  # to each other member, per round
    cost: Count = Field(1, ge=0, le=1_000_000)  # tokens a point costs the member who assigns it
    fine: Count = Field(3, ge=0, le=1_000_000)  # tokens a point costs the member who receives it
    show_history: bool = True  # an agent's prompt recalls its last rounds

    @field_validator("block")
    @classmethod
    def _whole_groups(cls, value: int, info: ValidationInfo) -> int:
        k = info.data.get("group_size")
        if k is not None and value % k:
            raise ValueError(f"must be a multiple of game.group_size ({k}): a block is cut into groups")
        return value

    @property
    def multiplier_fraction(self) -> Fraction:
        """The multiplier as the decimal the scenario wrote (1.6 → 8/5, not the nearest binary
        float), so payoffs are computed exactly."""
        return Fraction(repr(self.multiplier))


class PromptConfig(_Section):
    answer: Literal["direct", "cot"] = "direct"  # cot: {"reasoning", …} first, still one call per act
    persona: bool = True  # with a `population`, each agent's persona leads its prompt


class PunishmentParams(Params):
    game: GameConfig = GameConfig()
    prompt: PromptConfig = PromptConfig()
