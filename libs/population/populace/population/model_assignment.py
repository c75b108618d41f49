"""Which model answers for which agent: pure, seeded by the run's seed, the same on every host,
in one process and after any restore. An agent keeps its model for the whole run, so no agent's
calls mix models.

- By share (each model's `share`): exact quotas, the largest-remainder counts of the shares
  (populace.population.allocation), given to the agents of a seeded permutation in turn: with
  shares 0.5/0.5 and 1,001 agents, 501 and 500 agents, never a coin flip per agent.
- By a persona attribute (`assign: {attribute: education, map: {phd: a}, default: b}`): the
  agent's persona profile's value, as text, picks the model; values not in the map go to
  `default` (no default: refused, naming the value and the agent).
- By agent ids (`assign: {ranges: {a: [[0, 999]]}, default: b}`): inclusive ranges; agents in
  none go to `default` (none: refused); an agent in two ranges is refused.

The dummy benchmark's one model (no `models:` section) assigns nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from populace.core.contracts import ModelAssign, ModelEndpoint, RunConfig
from populace.population.allocation import largest_remainder
from populace.population.cast import Cast

# salt of the share permutation's generator: never the same stream as any other seeded draw
_SALT = 0x6D6F64656C73  # "models"


class AssignmentError(ValueError):
    """The run's `assign:` cannot place every agent (the message names the field and an agent)."""


def assignment(config: RunConfig, cast: Cast | None = None,
               profiles: Sequence[Mapping[str, Any]] | None = None) -> np.ndarray | None:
    """Per agent id, the index of its model in `config.models` (int8); None without `models:`.
    `cast` (or `profiles`, in agent order): who the agents are, read by `assign.attribute` only."""
    models = config.models
    if not models:
        return None
    if config.assign is None:
        return by_share(models, config.agents, config.seed)
    names = {m.name: i for i, m in enumerate(models)}
    if config.assign.attribute is not None:
        if profiles is None and cast is not None:
            profiles = cast.profiles
        return by_attribute(config.assign, names, profiles, config.agents)
    return by_ranges(config.assign, names, config.agents)


def by_share(models: Sequence[ModelEndpoint], agents: int, seed: int) -> np.ndarray:
    out = np.zeros(agents, dtype=np.int8)
    if len(models) == 1:
        return out
    counts = largest_remainder([m.share or 0 for m in models], agents)
    order = np.random.default_rng([seed, _SALT]).permutation(agents)
    start = 0
    for index, count in enumerate(counts):
        out[order[start:start + count]] = index
        start += count
    return out


def by_attribute(assign: ModelAssign, names: Mapping[str, int], profiles: Sequence[Mapping[str, Any]] | None,
                 agents: int) -> np.ndarray:
    if profiles is None or len(profiles) < agents:
        raise AssignmentError(f"assign.attribute: {assign.attribute!r} needs a persona for every agent "
                              f"({0 if profiles is None else len(profiles)} personas for {agents} agents)")
    by_value = {value: names[name] for value, name in assign.map.items()}
    default = names[assign.default] if assign.default is not None else None
    out = np.empty(agents, dtype=np.int8)
    for agent in range(agents):
        value = profiles[agent].get(assign.attribute)
        index = by_value.get(str(value) if value is not None else "")
        if index is None:
            if default is None:
                raise AssignmentError(f"assign.map: agent {agent}'s {assign.attribute} is {value!r}, which the map "
                                      "does not name, and there is no `default` model")
            index = default
        out[agent] = index
    return out


def by_ranges(assign: ModelAssign, names: Mapping[str, int], agents: int) -> np.ndarray:
    out = np.full(agents, -1, dtype=np.int8)
    for name, spans in assign.ranges.items():
        for first, last in spans:
            taken = out[first:last + 1] >= 0
            if taken.any():
                agent = first + int(np.argmax(taken))
                raise AssignmentError(f"assign.ranges.{name}: agent {agent} is already in another model's range")
            out[first:last + 1] = names[name]
    rest = out < 0
    if rest.any():
        if assign.default is None:
            raise AssignmentError(f"assign.ranges: agent {int(np.argmax(rest))} is in no range, and there is no "
                                  "`default` model")
        out[rest] = names[assign.default]
    return out


def counts(config: RunConfig, assigned: np.ndarray | None) -> dict[str, int]:
    """How many agents each model answers for."""
    if assigned is None:
        return {}
    tally = np.bincount(assigned, minlength=len(config.models))
    return {m.name: int(tally[i]) for i, m in enumerate(config.models)}
