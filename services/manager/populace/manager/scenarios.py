"""The start form's scenario: YAML text (pasted, or a file the page read into the textarea)
validated exactly as `populace run`/`validate` validate a file (populace.core.scenario,
populace.client.prepare), so the form shows the CLI's messages, each next to the field it
names. Parsed with yaml.safe_load only: no pickle, no eval.

A form may name files the manager reads (personas, a population YAML, an edge list): every
field marked SCENARIO_FILE is checked by `confine` before anything is read (a relative path
without '..' whose real path, symbolic links followed, is a regular file under the working
directory), and what a file holds is never shown (`without_file_content`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ValidationError

from populace.client.prepare import PreparedRun, parse_config, prepare
from populace.core.contracts import DEFAULT_SIMULATION, SCENARIO_FILE, RunConfig
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
    `simulation`: the form's menu, used when the text names none. `base`: the folder the
    scenario's files must be under (default: the working directory)."""
    root = (base or Path.cwd()).resolve()
    try:
        data = yaml_mapping(text, WHERE)
        chosen = simulation.strip()
        if chosen:
            named = data.get("simulation")
            if named is not None and named != chosen:
                raise ScenarioError(f"simulation: the scenario says {named!r}, the menu {chosen!r}; "
                                    "pick the scenario's or remove its `simulation:` line")
            data = {"simulation": chosen, **data}
        _no_import_path(data)
        config = parse_config(data)
        files = scenario_files(config)
        for name, path in files.items():
            confine(name, path, root)
    except ScenarioError as err:
        return Checked(errors=field_errors(str(err)))
    except ValidationError as err:
        return Checked(errors=field_errors(format_validation_error(err)))
    try:
        prepared = prepare(config, base=root, agents_given="agents" in data, scenario_path=None, scenario_text=text)
    except ScenarioError as err:  # reading the files happens here: what they hold is not shown
        return Checked(errors=without_file_content(field_errors(str(err)), files, set(data)))
    except ValidationError as err:
        return Checked(errors=without_file_content(field_errors(format_validation_error(err)), files, set(data)))
    return Checked(prepared=prepared)


def _no_import_path(data: dict) -> None:
    """What a form may not ask of the manager's machine that a user's own CLI may: import a
    module by path (`simulation: pkg.mod:Class` runs that module's import)."""
    sim = data.get("simulation")
    if isinstance(sim, str) and ":" in sim:
        raise ScenarioError(f"simulation: {sim!r} is an import path; the manager plays installed simulations "
                            f"only ({', '.join(simulations())}); use `populace run` for an import path")


def _marked(info) -> bool:
    extra = info.json_schema_extra
    return isinstance(extra, dict) and extra.get("format") == SCENARIO_FILE["format"]


def scenario_files(config: RunConfig) -> dict[str, str]:
    """Every file the scenario names, {dotted field: path as written}: each field marked
    SCENARIO_FILE in the run's models, nested ones and the graph generator's included."""
    from populace.graph.config import parse_graph

    found: dict[str, str] = {}

    def walk(model: BaseModel, prefix: str) -> None:
        for name, info in type(model).model_fields.items():
            value = getattr(model, name)
            if _marked(info) and isinstance(value, str):
                found[prefix + name] = value
            items = enumerate(value) if isinstance(value, (list, tuple)) else [(None, value)]
            for i, item in items:
                if isinstance(item, BaseModel):
                    walk(item, f"{prefix}{name}." if i is None else f"{prefix}{name}.{i}.")

    walk(config, "")
    if config.graph is not None:  # the generator's keys are the section's extras, checked by the graph library
        walk(parse_graph(config.graph.spec, config.agents), "graph.")
    return found


def confine(name: str, path: str, root: Path) -> Path:
    """The real path of the file field `name` names, or a ScenarioError when it is not a regular
    file under `root` (itself resolved): absolute, '~' or '..' refused as written, then symbolic
    links followed. Nothing is read."""
    where = f"{name}: {path!r}"
    written = Path(path)
    if path.startswith("~") or written.is_absolute() or ".." in written.parts:
        raise ScenarioError(f"{where}: the manager reads files under its working directory only "
                            "(a relative path without '..')")
    try:
        real = (root / written).resolve(strict=True)
    except FileNotFoundError:
        raise ScenarioError(f"{where}: no such file under the manager's working directory") from None
    except (OSError, RuntimeError, ValueError):  # a loop of links, a NUL byte, no permission
        raise ScenarioError(f"{where}: cannot be resolved under the manager's working directory") from None
    if not real.is_relative_to(root):
        raise ScenarioError(f"{where}: a link that leads outside the manager's working directory; the manager "
                            "reads files under its working directory only")
    if not real.is_file():  # a FIFO or a device would block or never end
        raise ScenarioError(f"{where}: not a regular file")
    return real


def without_file_content(errors: list[FieldError], files: dict[str, str], written: set[str]) -> list[FieldError]:
    """The errors of preparing a run with its files read, with nothing a file holds: an error
    about a file field (a parser's message quotes the file: a CSV header, a YAML line, a JSON
    value) says only which file, and so does a line that names no field the scenario wrote (a
    quoted line that happens to read `key: value`). The CLI shows the whole message."""
    why = ("was read but cannot be used; the manager does not show what a file holds: "
           "`populace validate SCENARIO` where the file is says why")
    out: list[FieldError] = []
    for e in errors:
        owner = next((f for f in files if e.field == f or e.field.startswith((f + ".", f + "["))), None)
        if owner is not None:
            e = FieldError(owner, f"{owner}: {files[owner]!r} {why}")
        elif not e.field or e.top not in written:
            e = FieldError("", f"{WHERE}: a file the scenario names {why}")
        if e not in out:
            out.append(e)
    return out


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
