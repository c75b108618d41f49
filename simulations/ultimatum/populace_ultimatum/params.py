"""The ultimatum game's parameters: the scenario's `game:` and `prompt:` sections."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from populace.sdk import Params

COT_MAX_TOKENS = 256  # chain of thought needs room to think
MEMORY_ROUNDS = 5  # past rounds an agent remembers (and sees in its prompt)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GameConfig(_Section):
    pie: int = Field(10, ge=1, le=1_000_000)  # whole coins to split
    # strangers: pairs are drawn again every round within blocks of this many agents (placed whole
    # on one host); 2 keeps each pair for the whole run (partners), who proposes is still drawn
    block: int = Field(100, ge=2, le=1_000_000)
    show_history: bool = True  # an agent's prompt recalls its last rounds

    @field_validator("pie", "block", mode="before")
    @classmethod
    def _whole(cls, value: object) -> object:
        if isinstance(value, bool):  # YAML's true is not 1
            raise ValueError("must be a whole number, not true/false")
        return value

    @field_validator("block")
    @classmethod
    def _even(cls, value: int) -> int:
        if value % 2:
            raise ValueError(f"{value} must be even (a block is cut into pairs)")
        return value


class PromptConfig(_Section):
    answer: Literal["direct", "cot"] = "direct"  # cot: {"reasoning", …} first, one structured call
    persona: bool = True  # with a `population`, each agent's persona leads its prompt


class UltimatumParams(Params):
    game: GameConfig = GameConfig()
    prompt: PromptConfig = PromptConfig()
