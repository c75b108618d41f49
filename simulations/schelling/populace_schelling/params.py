"""Schelling's parameters: the scenario's `grid:`, `rule:` and `prompt:` sections."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from populace.sdk import Params


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GridConfig(_Section):
    width: StrictInt = Field(50, ge=2, le=100_000)
    height: StrictInt = Field(50, ge=2, le=100_000)
    torus: StrictBool = True  # edges wrap around (every cell has 8 neighbours)
    kinds: StrictInt = Field(2, ge=2, le=8)  # agent i is of kind i % kinds


class RuleConfig(_Section):
    # an agent is content with at least this share of like neighbours among its occupied ones
    threshold: float = Field(0.3, ge=0.0, le=1.0, allow_inf_nan=False)
    decider: Literal["rule", "llm"] = "rule"  # rule: the classic model (no model call); llm: the agent decides
    # where a mover goes. anywhere: an empty cell drawn at random (the classic model); nearby: it
    # claims the empty cell within `radius` with the most neighbours of its kind, and the platform
    # grants each cell to one claimant (populace.sdk.claims); one whose cell went to another stays
    move: Literal["anywhere", "nearby"] = "anywhere"
    radius: StrictInt = Field(2, ge=1, le=50)  # how far (Moore, in steps) a nearby mover looks
    # who takes a turn. everyone: every resident, every round; unhappy: only those under the
    # threshold in the town as it stands (selected from the world: select(state, round, world))
    ask: Literal["everyone", "unhappy"] = "everyone"


class PromptConfig(_Section):
    persona: StrictBool = True  # with a `population`, each agent's persona leads its prompt


class SchellingParams(Params):
    grid: GridConfig = GridConfig()
    rule: RuleConfig = RuleConfig()
    prompt: PromptConfig = PromptConfig()
