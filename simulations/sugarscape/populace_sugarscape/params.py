"""Sugarscape's parameters: the scenario's `grid:`, `sugar:`, `traits:`, `rule:` and `prompt:`
sections. The defaults are Epstein & Axtell's (1996) chapter II landscape: a 50 × 50 torus with
two sugar mountains of capacity up to 4, growing back 1 a round; vision 1-6, metabolism 1-4 and
an endowment of 5-25 sugar, each drawn uniformly per agent."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from populace.sdk import Params


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GridConfig(_Section):
    width: StrictInt = Field(50, ge=2, le=100_000)
    height: StrictInt = Field(50, ge=2, le=100_000)
    torus: StrictBool = True  # edges wrap around


class SugarConfig(_Section):
    """The landscape: each cell's capacity falls from `max` at a peak by one level every
    `reach / max` of the grid's shorter side away from the nearest peak; cells start full and
    grow back `rate` a round, up to their capacity."""

    max: StrictInt = Field(4, ge=1, le=1000)
    # the mountains' summits, as fractions of the width and height ((0, 0): the top-left cell)
    peaks: list[tuple[float, float]] = Field([(0.25, 0.25), (0.75, 0.75)], min_length=1, max_length=100)
    reach: float = Field(0.45, gt=0.0, le=2.0, allow_inf_nan=False)  # capacity 0 beyond this share of the side
    rate: StrictInt = Field(1, ge=0, le=1000)  # growback a round (Epstein & Axtell's alpha)

    @field_validator("peaks")
    @classmethod
    def _peaks_on_grid(cls, peaks: list[tuple[float, float]]) -> list[tuple[float, float]]:
        for i, (x, y) in enumerate(peaks):
            if not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
                raise ValueError(f"peak {i}, ({x}, {y}), is not on the grid (fractions of its width and height, "
                                 "each in [0, 1])")
        return peaks


def _range(value: object) -> object:
    """[low, high] in a scenario; a whole number: that value for everyone."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    return value


LIMITS = {"vision": (1, 50), "metabolism": (0, 100), "endowment": (1, 1_000_000)}


class TraitsConfig(_Section):
    """Each agent's traits, drawn uniformly in [low, high] (a newcomer's too)."""

    vision: tuple[StrictInt, StrictInt] = (1, 6)  # how far it sees, along the four lattice directions
    metabolism: tuple[StrictInt, StrictInt] = (1, 4)  # sugar it burns a round
    endowment: tuple[StrictInt, StrictInt] = (5, 25)  # sugar it starts with

    @model_validator(mode="before")
    @classmethod
    def _whole_numbers(cls, data: object) -> object:
        return {k: _range(v) for k, v in data.items()} if isinstance(data, dict) else data

    @field_validator("vision", "metabolism", "endowment")
    @classmethod
    def _range_within(cls, value: tuple[int, int], info: ValidationInfo) -> tuple[int, int]:
        lowest, highest = LIMITS[info.field_name]
        low, high = value
        if not lowest <= low <= high <= highest:
            raise ValueError(f"[{low}, {high}] is not a range within [{lowest}, {highest}] (low first)")
        return value


class RuleConfig(_Section):
    # rule: Epstein & Axtell's movement rule, no model call (the best free cell in sight, the
    # nearest on a tie, staying when nothing is better); llm: the model picks among those cells
    decider: Literal["rule", "llm"] = "rule"
    # how many cells better than its own an agent claims (rule) or is offered (llm), best first:
    # the claims' rule goes down the list, so an agent beaten to its best cell may get its next
    choices: StrictInt = Field(4, ge=1, le=24)
    # Epstein & Axtell's replacement: every agent that starves is replaced by a newcomer with
    # traits drawn afresh, on a random free cell (the population stays the same size)
    replacement: StrictBool = False


class PromptConfig(_Section):
    persona: StrictBool = True  # with a `population`, each agent's persona leads its prompt (decider llm)


class SugarscapeParams(Params):
    grid: GridConfig = GridConfig()
    sugar: SugarConfig = SugarConfig()
    traits: TraitsConfig = TraitsConfig()
    rule: RuleConfig = RuleConfig()
    prompt: PromptConfig = PromptConfig()
