"""Finding a simulation by name: an entry point in the group `populace.simulations`
(`ratio-game`, or a user's installed package), or an import path (`mypkg.sim:PublicGoods`).
Services load simulations this way, never by import, so any installed package runs on them.

`resolve(config)` validates a run's config against its simulation: the simulation's own
sections by its Params model (errors name the field as the scenario wrote it), its model
defaults filled in, its placement constraints checked.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import entry_points
from typing import Any

from pydantic import ValidationError

from populace.core.contracts import COT_MAX_TOKENS, RunConfig, SimulationTables
from populace.sdk.simulation import Params, Simulation, SimulationError

ENTRY_POINT_GROUP = "populace.simulations"


def available() -> dict[str, str]:
    """Installed simulations: entry-point name -> `module:attr`."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def distribution(sim: type[Simulation]) -> tuple[str, str] | None:
    """(name, version) of the installed package that registers `sim` (for the run's manifest),
    or None for a simulation given by import path from an unregistered module."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if (ep.value == f"{sim.__module__}:{sim.__qualname__}" or ep.name == sim.name) and ep.dist is not None:
            return ep.dist.name, ep.dist.version
    return None


@lru_cache(maxsize=64)
def load_simulation(name: str) -> type[Simulation]:
    """The simulation class `name` refers to; SimulationError naming what failed."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        what = f"simulation {name!r} (import path)"
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except Exception as err:
            raise SimulationError(f"{what}: cannot import: {type(err).__name__}: {err}") from None
    else:
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not found:
            known = ", ".join(sorted(available())) or "(none installed)"
            raise SimulationError(f"unknown simulation {name!r}; installed: {known} (or give an import "
                                  "path such as mypkg.sim:MySimulation; a package installed with "
                                  "`uv pip install` is removed by `uv sync`: install it again)")
        what = f"simulation {name!r} (package {found[0].value.split(':')[0]})"
        try:
            obj = found[0].load()
        except Exception as err:
            raise SimulationError(f"{what}: cannot import: {type(err).__name__}: {err}") from None
    if not (isinstance(obj, type) and issubclass(obj, Simulation)):
        raise SimulationError(f"{what} is {obj!r}, not a populace.sdk.Simulation subclass")
    if ":" not in name and obj.name != name:
        # scenarios use the entry point's name, tables and reports the class's: one name for both
        raise SimulationError(f"{what}: the entry point is named {name!r} but the class says "
                              f"name = {obj.name!r}; make them the same")
    obj.check()
    return obj


@dataclass(frozen=True)
class Resolved:
    """A run's config checked against its simulation."""

    config: RunConfig  # the simulation's sections normalised, model defaults filled in
    simulation: type[Simulation]
    params: Params

    def tables(self) -> SimulationTables:
        """The simulation's tables for this run: with its measure's declared range or options
        (those of its answer schema's `enum` too), and who may be in which group (its group
        layout, which the recorder checks each group id against)."""
        tables = self.simulation.tables_for(self.params, self.instance().request_schema())
        if self.config.prototypes is not None:
            tables = tables.model_copy(update={"prototypes": True})
        if self.simulation.GroupEnv is None:
            return tables
        layout = self.simulation(self.params, agents=self.config.agents, seed=self.config.seed).group_layout()
        if layout is None:
            return tables
        return tables.model_copy(update={"group_sizes": list(layout.sizes), "group_block": layout.block})

    def instance(self, run_id: str = "", cast=None) -> Simulation:
        c = self.config
        return built(self.simulation, self.params, c, run_id=run_id, cast=cast)


def built(sim: type[Simulation], params: Params, config: RunConfig, **kw: Any) -> Simulation:
    """One run of `sim`, with the scenario's answer mode set before the simulation's own
    __init__ runs (which may read `self.answer_mode`); its __init__ takes what it always took."""
    if config.model.answer == Simulation.answer_mode:  # direct: built exactly as it always was
        return sim(params, agents=config.agents, rounds=config.rounds, seed=config.seed, **kw)
    instance = sim.__new__(sim)
    instance.answer_mode = config.model.answer
    instance.__init__(params, agents=config.agents, rounds=config.rounds, seed=config.seed, **kw)
    return instance


def resolve(config: RunConfig, simulation: type[Simulation] | None = None) -> Resolved:
    """Raises SimulationError (cannot load) or ValidationError (bad params, named by field).
    `simulation`: the class itself, when the caller holds it (a test of a class that is not
    installed or importable by name); default: found by `config.simulation`."""
    if simulation is not None:
        simulation.check()
    sim = simulation or load_simulation(config.simulation)
    params = sim.Params.model_validate(config.params)
    try:
        sim.check_run(params, config)
        _check_broadcasts(sim, config)
        _check_selection(sim, params, config)
        _check_prototypes(sim, config)
        _check_changes(sim, params, config)
        if config.model.answer == "cot":
            # an object answer schema to put "reasoning" in: named now, not on the first request
            built(sim, params, config).request_schema()
    except ValueError as err:
        raise _error(str(err), config.params) from None
    if sim.GroupEnv is not None:
        instance = sim(params, agents=config.agents, seed=config.seed)
        sizes = instance.group_sizes()
        if sizes is None or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in sizes):
            raise SimulationError(f"simulation {sim.name!r} declares a GroupEnv, but group_size() (or group_sizes()) "
                                  f"returned {sizes!r} for these parameters (whole numbers >= 1)")
        instance.group_layout()  # SimulationError naming what cannot work
    data = config.model_dump(mode="json", exclude=set(config.params))
    data.update(params.model_dump(mode="json"))
    defaults = model_defaults(sim, params, config.model.answer)
    if defaults:
        given = config.model.model_fields_set
        data["model"] = {**data["model"], **{k: v for k, v in defaults.items() if k not in given}}
    if data == config.model_dump(mode="json"):
        return Resolved(config, sim, params)  # resolved already (the orchestrator's): not validated again
    return Resolved(RunConfig.model_validate(data), sim, params)


def resolved_data(sim: type[Simulation], params: Params, data: dict) -> dict:
    """A config as written (`data`: the platform's keys and the simulation's sections, `params`
    those sections validated) as `resolve` makes it: the sections as the parameters model dumps
    them, the simulation's model defaults for what `model:` does not set. A config validated
    from this is one `resolve` takes as it is, so a client validates its config once."""
    out = {k: v for k, v in data.items() if k in RunConfig.model_fields}
    out.update(params.model_dump(mode="json"))
    model = out.get("model", {})
    defaults = model_defaults(sim, params, model.get("answer", "direct") if isinstance(model, dict) else "direct")
    if defaults and isinstance(model, dict):
        out["model"] = {**model, **{k: v for k, v in defaults.items() if k not in model}}
    return out


def model_defaults(sim: type[Simulation], params: Params, answer: str) -> dict[str, Any]:
    """The `model.*` values a run takes where its scenario sets none: the simulation's
    `model_defaults`; with chain of thought, `max_tokens` at least the platform's answer budget
    (a simulation's default written for direct answers leaves no room to think)."""
    defaults = dict(sim.model_defaults(params))
    if answer == "cot":
        own = defaults.get("max_tokens")
        defaults["max_tokens"] = max(own, COT_MAX_TOKENS) if isinstance(own, int) else COT_MAX_TOKENS
    return defaults


def _check_broadcasts(sim: type[Simulation], config: RunConfig) -> None:
    """A broadcast's fields are the simulation's post fields: a typo is named, not dropped."""
    from populace.sdk.post import post_fields

    names = post_fields(sim.Post)
    for i, b in enumerate(config.broadcasts):
        for key in b.fields:
            if key not in names:
                known = ", ".join(names) or "none besides text"
                raise ValueError(f"broadcasts.{i}.fields.{key}: not a field of {sim.name}'s post (it has: {known})")


def _check_changes(sim: type[Simulation], params: Params, config: RunConfig) -> None:
    """Newcomers the scenario schedules that the run cannot take, named before it starts: in a
    simulation with groups or a graph (laid out over the first agents), or one whose World has a
    column per agent (only its own decide can grow that world with them)."""
    pop = config.population
    if pop is None:
        return
    if pop.newcomers and (config.graph is not None or sim.edge_kinds):
        raise ValueError("population.newcomers: a run with a graph cannot have newcomers (its graph is built "
                         "over the first agents)")
    for i, change in enumerate(pop.changes):
        if not change.births:
            continue
        what = f"population.changes.{i}.{'born' if change.born else 'arrived'}"
        if config.graph is not None or sim.edge_kinds:
            raise ValueError(f"{what}: a run with a graph cannot have newcomers (its graph is built over the first "
                             "agents)")
        if sim.GroupEnv is not None:
            raise ValueError(f"{what}: simulation {sim.name!r} has groups, laid out over the first agents: it "
                             "cannot have newcomers")
        world = sim.Env.World
        if world is not None and any(c.size == "agents" for c in world.columns.values()):
            raise ValueError(f"{what}: simulation {sim.name!r} keeps a world column per agent, which only its own "
                             "decide can grow with newcomers (return Changes(born=…) with the world that holds them)")
        if config.has_personas and not pop.newcomers:
            raise ValueError(f"{what}: the agents have personas, and the newcomers would have none: declare "
                             "population.newcomers (how many newcomers' personas to keep)")


def _check_prototypes(sim: type[Simulation], config: RunConfig) -> None:
    from populace.sdk.prototypes import check

    check(sim, config)


def _check_selection(sim: type[Simulation], params: Params, config: RunConfig, world: bool = False) -> None:
    """Who acts in round 1, as the simulation's environment selects it, before anything starts:
    a rate outside [0, 1] or an agent the run does not have is named now, not on the fleet.
    A `select(state, round, world)` needs round 1's world, built only when `world` is set (by
    `check_world_selection`, after the memory check: every service resolves a run, and none
    should build its world for that)."""
    from populace.sdk.env import Env
    from populace.sdk.select import SelectionError, checked, takes

    if sim.Env.select is Env.select:
        return  # everyone acts
    sees_world = takes(sim.Env.select, 3)
    if sees_world != world:
        return
    where = f"{sim.Env.__name__}.select(state, 1{', world' if sees_world else ''})"
    try:
        env = sim.Env(built(sim, params, config))
        state = env.start()
        if sees_world:  # round 1's world, as the environment starts it (pure and seeded)
            start = env.start_world(state) if sim.Env.World is not None else None
            checked(env.select(state, 1, start), config.agents, where, start)
        else:
            checked(env.select(state, 1), config.agents, where)
    except SelectionError as err:
        raise ValueError(f"select: {err}") from None
    except ValidationError as err:  # a selector built with a bad value, e.g. rate(1.5)
        first = err.errors()[0]
        field = ".".join(str(x) for x in first["loc"]) or "value"
        raise ValueError(f"select: {where} built a {err.title} with {field} {first.get('input')!r}: "
                         f"{first['msg']}") from None
    except Exception as err:  # the simulation's own bug, named before the run starts
        raise ValueError(f"select: {where} raised {type(err).__name__}: {err}") from None


def check_world_selection(resolved: Resolved) -> None:
    """Round 1's selection of a `select(state, round, world)`, from the world the run starts with
    (built here): ValueError naming it (`select: …`), before the run starts."""
    _check_selection(resolved.simulation, resolved.params, resolved.config, world=True)


def _error(message: str, data: dict) -> ValidationError:
    """A ValidationError carrying one message (its text starts with the field it is about)."""
    return ValidationError.from_exception_data(
        "RunConfig", [{"type": "value_error", "loc": (), "input": data, "ctx": {"error": ValueError(message)}}])
