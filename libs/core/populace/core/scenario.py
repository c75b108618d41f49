"""Scenario files (YAML) → validated RunConfig, with errors that name the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from populace.core import yamlload
from populace.core.contracts import RunConfig

M = TypeVar("M", bound=BaseModel)


class ScenarioError(ValueError):
    """A scenario could not be loaded; the message names the offending field."""


# Fields whose value an error never repeats: where a key's source is named, a user may paste the
# key itself; and a URL may hold credentials (refused, not printed).
NEVER_ECHOED = frozenset({"api_key_env", "api_key_file", "base_url"})


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
        elif e["loc"][-1] in NEVER_ECHOED:  # a key pasted where its source's name belongs is not repeated
            lines.append(f"{field}: {msg}")
        else:
            got = e.get("input")
            if isinstance(got, dict) and NEVER_ECHOED & set(got):  # a section holding one: not that one
                got = {k: ("…" if k in NEVER_ECHOED else v) for k, v in got.items()}
            lines.append(f"{field}: {msg} (got {yamlload.short_repr(got)})")
    return "\n".join(lines)


def validated(model: type[M], data: object, what: str) -> M:
    """`data` as a `model`, or a ScenarioError naming each bad field."""
    if not isinstance(data, dict):
        raise ScenarioError(f"({what}): the file must hold a mapping of keys to values")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(format_validation_error(err)) from None


def parse_scenario(data: object) -> RunConfig:
    return validated(RunConfig, data, "scenario")


def load_yaml_mapping(path: str | Path, what: str = "scenario") -> tuple[dict, str]:
    """A YAML file's mapping and its text (kept for the run's manifest)."""
    p = Path(path)
    try:
        text = yamlload.read_text(p)
    except OSError as err:
        raise ScenarioError(f"{p}: cannot read ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise ScenarioError(f"{p}: not UTF-8 text (byte {err.start})") from None
    except yamlload.YamlLimitError as err:
        raise ScenarioError(f"{p}: {err}") from None
    return yaml_mapping(text, str(p), what), text


def yaml_mapping(text: str, where: str, what: str = "scenario") -> dict:
    """A YAML text's mapping (`where` names it in errors: a path, or e.g. '(form)'), loaded
    within populace.core.yamlload's limits."""
    try:
        data = yamlload.load(text)
    except yamlload.YamlLimitError as err:
        raise ScenarioError(f"{where}: {err}") from None
    except yaml.YAMLError as err:
        raise ScenarioError(f"{where}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"({what}): the file must hold a mapping of keys to values")
    return data


def merged(base: dict, extra: dict) -> dict:
    """`base` with `extra` merged in, mapping into mapping (`{"game": {"ratio": "1/2"}}` changes the
    ratio and keeps the scenario's other `game:` keys); any other value replaces. Neither input is
    changed. The one merge of overrides: `--set`, `simulate(..., game={...})`, sweeps, forks."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)  # the caller's value is not shared with the config built from it
    return out


def load_scenario_data(path: str | Path) -> tuple[dict, str]:
    return load_yaml_mapping(path, "scenario")


def load_scenario(path: str | Path) -> RunConfig:
    return parse_scenario(load_scenario_data(path)[0])
