"""Experiment grids (pure): a sweep file names a base scenario, a grid of scenario keys and
the seeds to replicate every cell with; `expand` turns it into one validated scenario per
run. Errors name the field, e.g. `grid.prompt.answer[1]: …`.

    name: prompts-by-education
    scenario: education-cot.yaml        # base scenario file, relative to this file (optional)
    base: {rounds: 3}                   # keys merged onto the base scenario (optional)
    grid:                               # dotted scenario keys → values; every combination runs
      game.ratio: ["2/3", "1/2"]
      prompt.answer: [direct, cot]
    seeds: [1, 2, 3]                    # each cell once per seed (sets `seed` and `model.seed`)
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from populace.core.contracts import Count, RunConfig
from populace.core.scenario import (
    ScenarioError,
    format_validation_error,
    load_scenario_data,
    load_yaml_mapping,
    merged,
    validated,
)

MAX_RUNS = 10_000


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("sweep", min_length=1, max_length=200)
    scenario: str | None = None
    base: dict[str, Any] = {}
    grid: dict[str, Annotated[list[Any], Field(min_length=1)]] = {}
    seeds: Annotated[list[Count], Field(min_length=1)] = [0]

    @field_validator("grid")
    @classmethod
    def _keys(cls, grid: dict[str, list]) -> dict[str, list]:
        # Any dotted scenario key: the platform's (RunConfig) or the simulation's own sections,
        # which the simulation checks when each cell is prepared (naming the cell and field).
        for key in grid:
            if not all(key.split(".")):
                raise ValueError(f"{key!r} is not a dotted scenario key such as game.ratio")
            if key in ("seed", "model.seed"):
                raise ValueError(f"{key!r}: replicate with `seeds:` instead, which sets seed and model.seed")
        return grid


@dataclass(frozen=True)
class Cell:
    """One run of the sweep: its grid values, its seed and its validated scenario."""

    index: int
    values: dict[str, Any]
    seed: int
    data: dict  # the scenario mapping (population paths relative to the sweep file)
    config: RunConfig

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={_short(v)}" for k, v in self.values.items()) or "base"


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return str(value)


def _set(data: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = copy.deepcopy(value)


def parse_sweep(data: object) -> SweepSpec:
    return validated(SweepSpec, data, "sweep")


def load_sweep(path: str | Path) -> tuple[SweepSpec, dict]:
    """The sweep and its base scenario mapping (the named scenario file merged with `base`)."""
    p = Path(path)
    data, _ = load_yaml_mapping(p, "sweep")
    spec = parse_sweep(data)
    base: dict = {}
    if spec.scenario is not None:
        scenario = Path(spec.scenario)
        scenario = scenario if scenario.is_absolute() else p.parent / scenario
        try:
            base, _ = load_scenario_data(scenario)
        except ScenarioError as err:
            raise ScenarioError(f"scenario: {err}") from None
        _rebase_population(base, scenario.parent)
    return spec, merged(base, spec.base)


def _rebase_population(data: dict, scenario_dir: Path) -> None:
    """A base scenario's population paths are relative to *its* file: make them absolute so
    they mean the same thing from the sweep's directory."""
    pop = data.get("population")
    if isinstance(pop, dict):
        for key in ("personas", "config"):
            if isinstance(pop.get(key), str) and not Path(pop[key]).is_absolute():
                pop[key] = str((scenario_dir / pop[key]).resolve())


def cell_label(values: dict[str, Any]) -> str:
    """Where a cell's error is: 'grid.game.ratio = 1/2, grid.prompt.answer = cot' (or 'base')."""
    return ", ".join(f"grid.{k} = {_short(v)}" for k, v in values.items()) or "base"


def cell_name(sweep: str, values: dict[str, Any], seed: int) -> str:
    """A run's name in a sweep: 'ratios: game={ratio: 1/2, offset: 5}, seed 1' (≤ 200 characters)."""
    cell = ", ".join(f"{k}={_short(v)}" for k, v in values.items())
    name = f"{sweep}: {cell}, seed {seed}" if cell else f"{sweep}, seed {seed}"
    return name if len(name) <= 200 else name[:199] + "…"


def expand(spec: SweepSpec, base: dict) -> list[Cell]:
    keys = list(spec.grid)
    combos = list(itertools.product(*(spec.grid[k] for k in keys))) if keys else [()]
    total = len(combos) * len(spec.seeds)
    if total > MAX_RUNS:
        raise ScenarioError(f"grid: {total} runs is too many (max {MAX_RUNS})")
    cells: list[Cell] = []
    for combo in combos:
        values = dict(zip(keys, combo))
        for seed in spec.seeds:
            data = copy.deepcopy(base)
            for key, value in values.items():
                _set(data, key, value)
            data["seed"] = seed
            _set(data, "model.seed", seed)
            if "name" not in values:  # a cell's runs say which cell they are, not only the base's name
                data["name"] = cell_name(spec.name, values, seed)
            try:
                config = RunConfig.model_validate(data)
            except ValidationError as err:
                raise ScenarioError(f"{cell_label(values)}:\n{format_validation_error(err)}") from None
            cells.append(Cell(len(cells), values, seed, data, config))
    return cells
