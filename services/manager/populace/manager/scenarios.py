"""The start form's scenario: YAML text (pasted, or a file the page read into the textarea)
validated exactly as `populace run`/`validate` validate a file (populace.core.scenario,
populace.client.prepare), so the form shows the CLI's messages, each next to the field it
names. Parsed with yaml.safe_load only: no pickle, no eval."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from populace.client.prepare import PreparedRun, parse_config, prepare
from populace.core.contracts import DEFAULT_SIMULATION
from populace.core.scenario import ScenarioError, format_validation_error, yaml_mapping
from populace.manager.views import FieldError, field_errors
from populace.sdk.registry import available

WHERE = "(scenario)"  # how errors about the text as a whole name it
DEFAULT_TEXT = """\
# a scenario as `populace run FILE` takes it; `simulation:` here wins over the menu
agents: 1000
rounds: 3
seed: 0
model:
  backend: dummy
  latency_s: 0.05
"""


@dataclass
class Checked:
    prepared: PreparedRun | None = None
    errors: list[FieldError] = field(default_factory=list)


def simulations() -> list[str]:
    """The installed simulations (entry points `populace.simulations`), as `populace simulations`."""
    return sorted(available())


def validate(text: str, simulation: str = "", base: Path | None = None) -> Checked:
    """The scenario prepared for submission, or the CLI's error lines as field errors.
    `simulation`: the form's menu, used when the text names none."""
    try:
        data = yaml_mapping(text, WHERE)
        chosen = simulation.strip()
        if chosen:
            named = data.get("simulation")
            if named is not None and named != chosen:
                raise ScenarioError(f"simulation: the scenario says {named!r}, the menu {chosen!r}; "
                                    "pick the scenario's or remove its `simulation:` line")
            data = {"simulation": chosen, **data}
        _form_limits(data)
        config = parse_config(data)
        prepared = prepare(config, base=base or Path.cwd(), agents_given="agents" in data,
                           scenario_path=None, scenario_text=text)
    except ScenarioError as err:
        return Checked(errors=field_errors(str(err)))
    except ValidationError as err:
        return Checked(errors=field_errors(format_validation_error(err)))
    return Checked(prepared=prepared)


def _form_limits(data: dict) -> None:
    """What a form may not ask of the manager's machine that a user's own CLI may: import a
    module by path (`simulation: pkg.mod:Class` runs that module's import), or read a file
    outside the manager's working directory as a population."""
    sim = data.get("simulation")
    if isinstance(sim, str) and ":" in sim:
        raise ScenarioError(f"simulation: {sim!r} is an import path; the manager plays installed simulations "
                            f"only ({', '.join(simulations())}); use `populace run` for an import path")
    pop = data.get("population")
    if isinstance(pop, dict):
        for key in ("personas", "config"):
            path = pop.get(key)
            if isinstance(path, str) and (Path(path).expanduser().is_absolute() or ".." in Path(path).parts):
                raise ScenarioError(f"population.{key}: {path!r}: the manager reads populations under its "
                                    "working directory only (a relative path without '..')")


def form_context(text: str = DEFAULT_TEXT, simulation: str = "", errors: list[FieldError] | None = None) -> dict:
    errors = errors or []
    return {"scenario_text": text, "simulations": simulations(), "chosen": simulation,
            "default_simulation": DEFAULT_SIMULATION, "errors": errors,
            "error_fields": {e.top for e in errors if e.field}}


# --- the parameter form: fields rendered from the JSON schemas of RunConfig and the simulation ---
# What of RunConfig the form does not ask: the simulation is the menu; a population's digest is
# the client's to fill in (the form names the personas file or population YAML instead).
FORM_SKIPS = ("simulation", "population.digest")
MAX_DEPTH = 3


@dataclass(frozen=True)
class ParamField:
    name: str  # dotted, as the CLI's messages name it: 'agents', 'model.backend', 'game.ratio'
    label: str
    kind: str  # integer | number | string | boolean | enum | list
    default: object = None
    choices: tuple[str, ...] = ()
    optional: bool = False  # may be left empty (null, or a section that is absent)
    help: str = ""
    int_choices: bool = False  # an enum of integers (e.g. placement.agents_per_process: 0 or 1)

    @property
    def section(self) -> str:
        return self.name.split(".", 1)[0] if "." in self.name else "run"

    def shown(self, value: object) -> str:
        """The default as the input shows it."""
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (list, tuple)):
            return ", ".join(str(v) for v in value)
        return str(value)


def _resolve(prop: dict, defs: dict) -> tuple[dict, bool]:
    """A property's schema with its $ref followed and `X | None` unwrapped; (schema, optional)."""
    optional = False
    if "anyOf" in prop:
        options = [p for p in prop["anyOf"] if p.get("type") != "null"]
        optional = len(options) < len(prop["anyOf"])
        if len(options) != 1:
            return {}, optional
        prop = {**{k: v for k, v in prop.items() if k != "anyOf"}, **options[0]}
    if "$ref" in prop:
        target = defs.get(prop["$ref"].rsplit("/", 1)[-1], {})
        prop = {**target, **{k: v for k, v in prop.items() if k != "$ref"}}
    return prop, optional


def _flatten(schema: dict, defs: dict, prefix: str = "", depth: int = 0, optional: bool = False,
             defaults: dict | None = None) -> list[ParamField]:
    out: list[ParamField] = []
    for key, raw in schema.get("properties", {}).items():
        if prefix + key in FORM_SKIPS:
            continue
        prop, opt = _resolve(raw, defs)
        name = prefix + key
        default = (defaults or {}).get(key, prop.get("default"))
        kind = prop.get("type")
        if kind == "object" and "properties" in prop and depth < MAX_DEPTH:
            out += _flatten(prop, defs, name + ".", depth + 1, optional or opt,
                            default if isinstance(default, dict) else None)
            continue
        label = prop.get("title") or key
        common = {"default": default, "optional": optional or opt, "help": (prop.get("description") or "")[:200]}
        if "enum" in prop:
            out.append(ParamField(name, label, "enum", choices=tuple(str(c) for c in prop["enum"]),
                                  int_choices=all(isinstance(c, int) for c in prop["enum"]), **common))
        elif kind in ("integer", "number", "string", "boolean"):
            out.append(ParamField(name, label, kind, **common))
        elif kind == "array" and prop.get("items", {}).get("type") in ("string", "number", "integer"):
            out.append(ParamField(name, label, "list", **common))
    return out


def param_fields(simulation: str) -> list[ParamField]:
    """The run's own fields (agents, rounds, seed, model, placement, budget) and the
    simulation's parameters, as form inputs; [] for a simulation that cannot be loaded."""
    from populace.core.contracts import RunConfig
    from populace.sdk.registry import load_simulation
    from populace.sdk.simulation import SimulationError

    run_schema = RunConfig.model_json_schema()
    fields = _flatten(run_schema, run_schema.get("$defs", {}))
    try:
        sim = load_simulation(simulation)
    except SimulationError:
        return fields
    sim_schema = sim.Params.model_json_schema()
    return fields + _flatten(sim_schema, sim_schema.get("$defs", {}))


def _typed(field_: ParamField, text: str) -> object:
    """An input's text as its field's type where it reads as one; as it was otherwise, so
    validation names the field and shows what was typed."""
    text = text.strip()
    try:
        if field_.kind == "integer" or (field_.kind == "enum" and field_.int_choices):
            return int(text)
        if field_.kind == "number":
            return float(text)
    except ValueError:
        return text
    if field_.kind == "boolean":
        return {"true": True, "false": False}.get(text.lower(), text)
    if field_.kind == "list":
        return [item.strip() for item in text.split(",") if item.strip()]
    return text


def form_mapping(form: dict[str, str], fields: list[ParamField], simulation: str) -> dict:
    """The scenario the parameter form describes: every field given a value, nested by its
    dotted name (empty ones left out, so their defaults apply)."""
    data: dict = {"simulation": simulation} if simulation else {}
    for f in fields:
        text = form.get("p." + f.name, "")
        if not text.strip():
            continue
        node = data
        parts = f.name.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = _typed(f, text)
    return data


def validate_form(form: dict[str, str], simulation: str) -> tuple[str, Checked]:
    """The parameter form as scenario YAML (kept in the run's manifest), validated as a file is."""
    import yaml

    text = yaml.safe_dump(form_mapping(form, param_fields(simulation), simulation), sort_keys=False,
                          allow_unicode=True)
    return text, validate(text, simulation)


def param_form_context(simulation: str, form: dict[str, str] | None = None,
                       errors: list[FieldError] | None = None) -> dict:
    """The parameter form's inputs (typed values kept after a refusal), each with the errors
    naming it; errors naming no input are listed apart."""
    fields = param_fields(simulation)
    errors = errors or []
    values = {f.name: (form.get("p." + f.name, "") if form is not None else f.shown(f.default)) for f in fields}
    by_field: dict[str, list[str]] = {f.name: [] for f in fields}
    loose: list[FieldError] = []
    for e in errors:
        owner = next((f.name for f in fields if e.field == f.name or e.field.startswith(f.name + ".")), None)
        if owner is None:
            loose.append(e)
        else:
            by_field[owner].append(e.message)
    sections: dict[str, list[ParamField]] = {}
    for f in fields:
        sections.setdefault(f.section, []).append(f)
    return {"simulations": simulations(), "chosen": simulation, "default_simulation": DEFAULT_SIMULATION,
            "sections": sections, "values": values, "field_errors": by_field, "errors": loose,
            "any_errors": bool(errors)}
