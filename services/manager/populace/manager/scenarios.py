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
