"""Hostile or broken input files: every YAML a user hands us (scenario, sweep, population,
`--set`, the manager's upload, the Python API) loads within limits and fails in one line that
names the key and the limit; an error never formats an unbounded value; a personas file is
checked line by line against POPULACE_PERSONA_MAX_BYTES, and the manifest stays small."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from populace.client.prepare import USER_EXAMPLE_MAX_CHARS, prepare_file
from populace.client.steer import OverrideError, overrides
from populace.core import yamlload
from populace.core.contracts import RunConfig, RunStart
from populace.core.scenario import ScenarioError, format_validation_error, load_scenario_data, yaml_mapping
from populace.population import PopulationError
from populace.population.config import parse_population_yaml
from populace.population.jsonl import read_personas


def alias_bomb() -> str:
    """345 bytes or so: nine anchors, each a list of nine aliases to the one before (9**9 values)."""
    levels = ["&a [" + ",".join(['"lol"'] * 9) + "]"]
    for prev, name in zip("abcdefgh", "bcdefghi"):
        levels.append(f"&{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "[" + ", ".join(levels) + "]"


HOSTILE = {
    "alias bomb in name": ("name: " + alias_bomb() + "\n", "name.", "more than 100,000 values"),
    "alias bomb in a simulation key": ("simulation: ratio-game\ngame: {ratio: " + alias_bomb() + "}\n",
                                       "game.ratio.", "more than 100,000 values"),
    "100,000 nested [": ("name: " + "[" * 100_000 + "]" * 100_000 + "\n", "name.0.0.0.", "nested deeper than 64"),
    "20,000 nested {a:": ("name: " + "{a: " * 20_000 + "1" + "}" * 20_000 + "\n", "name.a.a.a.",
                          "nested deeper than 64"),
    "a recursive alias": ("name: &x [1, *x]\n", "name.1", "alias *x names a value that contains it (no cycles)"),
    "an integer of 5,000 digits": ("agents: " + "9" * 5000 + "\n", "line 1", "an integer of 5,000 digits"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_scenario_fails_in_one_line_naming_the_key_and_the_limit(case):
    text, key, limit = HOSTILE[case]
    with pytest.raises(ScenarioError) as caught:
        yaml_mapping(text, "s.yaml")
    message = str(caught.value)
    assert message.startswith(f"s.yaml: {key}") and limit in message and "(" in message, message
    assert "\n" not in message and len(message) < 200


def test_a_document_over_the_size_limit_is_refused_unread(tmp_path):
    path = tmp_path / "big.yaml"
    with path.open("wb") as f:  # sparse: 1 GiB on paper, nothing on disk
        f.truncate(1 << 30)
    with pytest.raises(ScenarioError, match=r"big.yaml: \(top level\): more than the 262,144-byte limit"):
        load_scenario_data(path)
    with pytest.raises(ScenarioError, match=r"form: \(top level\): more than the 262,144-byte limit"):
        yaml_mapping("#" * (yamlload.MAX_BYTES + 1), "form")


def test_ordinary_anchors_and_merges_still_load():
    text = "base: &b {ratio: 2/3, max_value: 100}\ngame: {<<: *b, max_value: 50}\nlist: [*b, *b]\n"
    data = yaml_mapping(text, "s.yaml")
    assert data["game"] == {"ratio": "2/3", "max_value": 50} and data["list"] == [data["base"]] * 2
    value, levels = yamlload.load("a: " + "[" * 64 + "]" * 64)["a"], 0  # 64 levels: the limit, allowed
    while isinstance(value, list):
        value, levels = value[0] if value else None, levels + 1
    assert levels == 64
    with pytest.raises(yamlload.YamlLimitError, match="nested deeper than 64"):
        yamlload.load("a: " + "[" * 65 + "]" * 65)


def test_a_population_file_has_the_same_limits(tmp_path):
    with pytest.raises(PopulationError, match=r"^pop.yaml: attributes\..*more than 100,000 values"):
        parse_population_yaml("attributes: " + alias_bomb() + "\n", "pop.yaml")
    with pytest.raises(PopulationError, match="duplicate key 'a'"):  # still strict
        parse_population_yaml("a: 1\na: 2\n", "pop.yaml")


def test_a_set_value_has_the_same_limits():
    with pytest.raises(OverrideError, match=r"^--set name: .*nested deeper than 64 levels \(the limit\)"):
        overrides(["name=" + "[" * 1000])
    assert overrides(["game.ratio=1/2"]) == {"game": {"ratio": "1/2"}}


def test_the_manager_upload_and_the_python_api_refuse_it_the_same_way(tmp_path):
    from populace.manager.scenarios import validate

    checked = validate("name: " + alias_bomb() + "\n")
    assert checked.prepared is None and len(checked.errors) == 1
    assert "more than 100,000 values" in str(checked.errors[0]), checked.errors
    path = tmp_path / "s.yaml"
    path.write_text("name: " + "{a: " * 20_000 + "}" * 20_000 + "\n")
    with pytest.raises(ScenarioError, match="nested deeper than 64 levels"):
        prepare_file(path)


def test_a_validation_error_never_formats_a_whole_value():
    huge = ["x" * 1000] * 100_000
    with pytest.raises(ValidationError) as caught:
        RunConfig.model_validate({"name": huge})
    message = format_validation_error(caught.value)
    assert message.startswith("name: ") and len(message) < 300, message[:400]
    assert len(yamlload.short_repr(huge)) <= 80 and len(yamlload.short_repr("y" * 10**7)) <= 80


def persona_line(i: int, text: str = "") -> str:
    return json.dumps({"profile": {"education": "phd"}, "persona": {"name": f"P{i}", "description": text}}) + "\n"


def test_a_personas_line_over_the_limit_is_refused_after_reading_only_the_limit(tmp_path):
    path = tmp_path / "p.jsonl"
    with path.open("wb") as f:  # a first line of 1 GiB (sparse), as a hostile file has
        f.write(b'{"profile": {"a": 1}, "persona": {"description": "')
        f.truncate(1 << 30)
    with pytest.raises(PopulationError, match=r"p.jsonl:1: a persona of more than 65,536 bytes, over the limit of "
                                              r"65,536 \(POPULACE_PERSONA_MAX_BYTES\)"):
        read_personas(path, 65_536)
    path.write_text(persona_line(0) + persona_line(1, "z" * 70_000) + persona_line(2))
    with pytest.raises(PopulationError, match=r"p.jsonl:2: a persona of more than 65,536 bytes, over the limit"):
        read_personas(path, 65_536)
    records, data = read_personas(path, 100_000)
    assert [r["persona"]["name"] for r in records] == ["P0", "P1", "P2"] and data == path.read_bytes()


def scenario_with_personas(tmp_path: Path, first_persona: str) -> Path:
    (tmp_path / "p.jsonl").write_text(persona_line(0, first_persona) + persona_line(1))
    path = tmp_path / "s.yaml"
    path.write_text("simulation: ratio-game\nrounds: 1\nprompt: {persona: true}\npopulation: {personas: p.jsonl}\n")
    return path


def test_validate_names_the_setting_and_the_manifest_stays_small(tmp_path, monkeypatch):
    path = scenario_with_personas(tmp_path, "w" * 200_000)
    with pytest.raises(ScenarioError, match=r"^population.personas: .*p.jsonl:1: a persona of more than 65,536 "
                                            r"bytes, over the limit of 65,536 \(POPULACE_PERSONA_MAX_BYTES\)$"):
        prepare_file(path)
    monkeypatch.setenv("POPULACE_PERSONA_MAX_BYTES", "262144")  # allowed: then the manifest clips its example
    prepared = prepare_file(path)
    example = prepared.manifest["prompt"]["user_example"]
    assert "w" * 1000 in example and len(example) < USER_EXAMPLE_MAX_CHARS + 50  # agent 0's persona, clipped
    assert example.endswith("more characters)")
    start = RunStart(run_id="r", config=prepared.config, manifest=prepared.manifest).model_dump_json()
    assert len(start) < 100_000  # far under NATS' 1 MB max_payload: the persona is not in it
    monkeypatch.setenv("POPULACE_PERSONA_MAX_BYTES", "lots")
    with pytest.raises(ScenarioError, match=r"^POPULACE_PERSONA_MAX_BYTES: Input should be a valid integer"):
        prepare_file(path)


def test_a_blob_over_the_limit_says_how_long_the_line_is():
    from populace.population.jsonl import parse_personas

    blob = (persona_line(0) + persona_line(1, "z" * 70_000)).encode()
    with pytest.raises(PopulationError, match=r"^blob:2: a persona of 70,0\d\d bytes, over the limit of 65,536"):
        parse_personas(blob, "blob", 65_536)
    assert len(parse_personas(blob, "blob")) == 2  # no limit given: as before
