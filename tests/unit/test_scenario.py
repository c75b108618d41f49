"""Scenario files: YAML → RunConfig, and errors that name the offending field."""

from __future__ import annotations

import textwrap
from fractions import Fraction

import pytest

from populace.client.prepare import parse_config, prepare_file
from populace.core.contracts import RunConfig
from populace.core.scenario import ScenarioError, load_scenario_data


def load_scenario(path) -> RunConfig:
    """A scenario file as `populace run` reads it: the platform's keys and the simulation's own."""
    return prepare_file(path).config


def parse_scenario(data) -> RunConfig:
    return parse_config(data)

EXAMPLE = textwrap.dedent("""\
    # guess 2/3 of the average, 1,000 dummy agents, three rounds
    name: guess-two-thirds
    agents: 1000
    rounds: 3
    seed: 42
    game:
      ratio: 2/3          # a fraction string, or a number such as 0.5
      offset: 0
      max_value: 100
      history_window: 5
    model:
      backend: dummy
      latency_s: 0.05
      seed: 7
    placement:
      agents_per_process: 0
""")


def write(tmp_path, text: str, name: str = "scenario.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_example_scenario_loads(tmp_path):
    cfg = load_scenario(write(tmp_path, EXAMPLE))
    assert isinstance(cfg, RunConfig)
    assert (cfg.name, cfg.agents, cfg.rounds, cfg.seed) == ("guess-two-thirds", 1000, 3, 42)
    game = cfg.params["game"]
    assert Fraction(game["ratio"]) == Fraction(2, 3)
    assert (game["offset"], game["max_value"], game["history_window"]) == (0.0, 100.0, 5)
    assert (cfg.model.backend, cfg.model.latency_s, cfg.model.seed) == ("dummy", 0.05, 7)
    assert cfg.placement.agents_per_process == 0


def test_load_accepts_str_path(tmp_path):
    assert load_scenario(str(write(tmp_path, "agents: 10\n"))).agents == 10


def test_minimal_scenario_uses_defaults(tmp_path):
    cfg = load_scenario(write(tmp_path, "agents: 12\n"))
    assert cfg == prepare_file(write(tmp_path, "agents: 12\nsimulation: ratio-game\n", "b.yaml")).config
    assert (cfg.simulation, cfg.agents, cfg.rounds) == ("ratio-game", 12, 3)


def test_numeric_ratio_and_offset(tmp_path):
    cfg = load_scenario(write(tmp_path, "game:\n  ratio: 0.5\n  offset: 5\n"))
    assert cfg.params["game"]["ratio"] == "0.5" and cfg.params["game"]["offset"] == 5.0


def test_parse_scenario_matches_load(tmp_path):
    import yaml

    parsed = parse_scenario(yaml.safe_load(EXAMPLE))
    assert parsed.params["game"]["ratio"] == "2/3" and parsed.agents == 1000
    assert load_scenario_data(write(tmp_path, EXAMPLE))[0] == yaml.safe_load(EXAMPLE)


# --- errors name the field ------------------------------------------------------------------
@pytest.mark.parametrize("text,field,words", [
    ("agents: 10\ncolour: blue\n", "colour", "unknown key"),
    ("game:\n  foo: 1\n", "game.foo", "unknown key"),
    ("model:\n  top_k: 40\n", "model.top_k", "unknown key"),
    ("game:\n  ratio: 0\n", "game.ratio", "> 0"),
    ("game:\n  ratio: -1/2\n", "game.ratio", "> 0"),
    ("game:\n  ratio: abc\n", "game.ratio", "abc"),
    ("rounds: 0\n", "rounds", "greater than or equal to 1"),
    ("agents: 0\n", "agents", "greater than or equal to 1"),
    ("agents: many\n", "agents", "valid integer"),
    ("agents: 2.5\n", "agents", "integer"),
    ("model:\n  latency_s: slow\n", "model.latency_s", "valid number"),
    ("model:\n  latency_s: -1\n", "model.latency_s", "greater than or equal to 0"),
    ("model:\n  backend: gpt\n", "model.backend", "dummy"),
    ("game: 5\n", "game", "dictionary"),
    ("placement:\n  agents_per_process: 1\nagents: 20000\n", "placement.agents_per_process", "too many"),
])
def test_bad_scenario_names_field(tmp_path, text, field, words):
    with pytest.raises(ScenarioError) as exc:
        load_scenario(write(tmp_path, text))
    msg = str(exc.value)
    assert field in msg
    assert words in msg
    if words == "unknown key":
        assert msg.startswith(f"{field}: unknown key")
    # the same data, given as a dict, fails the same way
    import yaml

    with pytest.raises(ScenarioError) as exc2:
        parse_scenario(yaml.safe_load(text))
    assert str(exc2.value) == msg


def test_field_errors_start_with_field_path(tmp_path):
    with pytest.raises(ScenarioError) as exc:
        load_scenario(write(tmp_path, "rounds: 0\ngame:\n  ratio: 0\n"))
    lines = str(exc.value).splitlines()
    assert len(lines) == 2
    assert {line.split(":", 1)[0] for line in lines} == {"rounds", "game.ratio"}


@pytest.mark.parametrize("text", ["- agents: 10\n- rounds: 3\n", "just a string\n", "42\n", ""])
def test_non_mapping_file(tmp_path, text):
    with pytest.raises(ScenarioError, match="mapping"):
        load_scenario(write(tmp_path, text))


@pytest.mark.parametrize("data", [[1, 2], "x", None, 3])
def test_parse_scenario_non_mapping(data):
    with pytest.raises(ScenarioError, match="mapping"):
        parse_scenario(data)


@pytest.mark.parametrize("text", ["agents: [1, 2\n", "game:\n  ratio: 2/3\n offset: 1\n", "a: b: c\n", "\tagents: 1\n"])
def test_invalid_yaml(tmp_path, text):
    p = write(tmp_path, text)
    with pytest.raises(ScenarioError) as exc:
        load_scenario(p)
    assert "not valid YAML" in str(exc.value)
    assert str(p) in str(exc.value)


def test_missing_file(tmp_path):
    p = tmp_path / "nope.yaml"
    with pytest.raises(ScenarioError) as exc:
        load_scenario(p)
    assert str(p) in str(exc.value)
    assert "cannot read" in str(exc.value)


def test_directory_is_not_a_scenario(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path)


def test_scenario_error_is_value_error():
    assert issubclass(ScenarioError, ValueError)


def test_ratio_error_mentions_input_once():
    with pytest.raises(ScenarioError) as exc:
        parse_scenario({"game": {"ratio": 0}})
    assert str(exc.value).count("(got 0)") == 1


@pytest.mark.parametrize("data, field", [
    ({"agents": True}, "agents"),
    ({"rounds": False}, "rounds"),
    ({"model": {"latency_s": True}}, "model.latency_s"),
    ({"game": {"offset": True}}, "game.offset"),
])
def test_true_false_is_not_a_number(data, field):
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(data)
    assert str(exc.value).startswith(f"{field}:")


def test_cross_field_rule_names_its_field_without_dumping_the_input():
    with pytest.raises(ScenarioError) as exc:
        parse_scenario({"agents": 20_000, "placement": {"agents_per_process": 1}})
    msg = str(exc.value)
    assert msg.startswith("placement.agents_per_process:")
    assert "'agents'" not in msg


def test_tiny_positive_float_ratio_is_accepted():
    assert float(parse_scenario({"game": {"ratio": 1e-12}}).params["game"]["ratio"]) == pytest.approx(1e-12)
