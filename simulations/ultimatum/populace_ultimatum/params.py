"""The ultimatum game's parameters: the scenario's `game:` and `prompt:` sections."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from populace.sdk import Params

COT_MAX_TOKENS = 256  # chain of thought needs room to think
MEMORY_ROUNDS = 5  # past rounds an agent remembers (and sees in its prompt)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GameConfig(_Section):
    pie: int = Field(10, ge=1, le=1_000_000)  # whole coins to split
    # strangers: pairs are drawn again every round within blocks of this many agents (placed whole
    # on one host); 2 keeps each pair for the whole run (partners), roles still alternate
    block: int = Field(100, ge=2, le=1_000_000)
    show_history: bool = True  # an agent's prompt recalls its last rounds


class PromptConfig(_Section):
    answer: Literal["direct", "cot"] = "direct"  # cot: {"reasoning", …} first, one structured call
    persona: bool = True  # with a `population`, each agent's persona leads its prompt


class UltimatumParams(Params):
    game: GameConfig = GameConfig()
    prompt: PromptConfig = PromptConfig()
