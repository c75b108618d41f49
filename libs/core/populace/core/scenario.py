"""Scenario files (YAML) → validated RunConfig, with errors that name the field."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from populace.core.contracts import RunConfig


class ScenarioError(ValueError):
    """A scenario could not be loaded; the message names the offending field."""


def format_validation_error(err: ValidationError) -> str:
    """One line per problem, each starting with the dotted field name."""
    lines = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if not e["loc"]:  # a cross-field rule: its message starts with the field it is about
            lines.append(msg)
            continue
        field = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"{field}: unknown key")
        else:
            lines.append(f"{field}: {msg} (got {e.get('input')!r})")
    return "\n".join(lines)


def parse_scenario(data: object) -> RunConfig:
    if not isinstance(data, dict):
        raise ScenarioError("(scenario): the file must hold a mapping of keys to values")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(format_validation_error(err)) from None


def load_scenario_data(path: str | Path) -> tuple[dict, str]:
    """The scenario file's mapping and its text (kept for the run's manifest)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise ScenarioError(f"{p}: cannot read ({err.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ScenarioError(f"{p}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ScenarioError("(scenario): the file must hold a mapping of keys to values")
    return data, text


def load_scenario(path: str | Path) -> RunConfig:
    return parse_scenario(load_scenario_data(path)[0])
