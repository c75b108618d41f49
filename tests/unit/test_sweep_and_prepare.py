"""Sweep grids and scenario preparation (population resolution, manifest) without a broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from populace_ratio_game.params import COT_MAX_TOKENS

from populace.client.prepare import prepare, prepare_file
from populace.client.sweep import plan
from populace.core.contracts import RunConfig
from populace.core.objects import digest_of
from populace.core.scenario import ScenarioError, parse_scenario
from populace.core.sweep import expand, load_sweep, parse_sweep


def scenario(data: dict) -> RunConfig:
    """A scenario mapping checked as `populace run` checks it: the platform's keys, then the
    simulation's own sections."""
    return prepare(parse_scenario(data), agents_given="agents" in data).config

ROOT = Path(__file__).resolve().parents[2]
EDUCATION = ROOT / "examples" / "population" / "education.yaml"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def personas_file(tmp_path: Path, n: int) -> Path:
    lines = [json.dumps({"profile": {"education": ["Ph.D.", "high school"][i % 2], "age": 30 + i},
                         "persona": {"name": f"P{i}", "description": "calm"},
                         "provenance": {"mode": "template", "seed": 3}}) for i in range(n)]
    return write(tmp_path, "p.jsonl", "\n".join(lines) + "\n")


# --- scenario keys ------------------------------------------------------------------
def test_population_needs_one_source_or_a_schedule():
    with pytest.raises(ScenarioError, match="population: give one of `personas`"):
        parse_scenario({"population": {}})
    with pytest.raises(ScenarioError, match="population: give one of `personas`"):
        parse_scenario({"population": {"personas": "a.jsonl", "config": "b.yaml"}})
    assert parse_scenario({"population": {"changes": [{"after": "every", "left": 0.1}]}}).population.changes


@pytest.mark.parametrize("data, field", [
    ({"prompt": {"system": "clever"}}, "prompt.system"),
    ({"prompt": {"answer": "essay"}}, "prompt.answer"),
    ({"prompt": {"tone": "warm"}}, "prompt.tone"),
    ({"population": {"personas": "a", "size": 3}}, "population.size"),
    ({"population": {"personas": "a", "digest": "abc"}}, "population.digest"),
])
def test_bad_prompt_and_population_keys_name_the_field(data, field):
    with pytest.raises(ScenarioError) as err:
        scenario(data)
    assert str(err.value).startswith(field)


def test_an_unknown_simulation_is_named_before_anything_else():
    with pytest.raises(ScenarioError, match=r"^simulation: unknown simulation 'tennis'; installed: "):
        scenario({"simulation": "tennis", "population": {"personas": "nope.jsonl"}})


def test_cot_gets_room_to_think_unless_max_tokens_is_set():
    assert scenario({"prompt": {"answer": "cot"}}).model.max_tokens == COT_MAX_TOKENS
    assert scenario({"prompt": {"answer": "cot"}, "model": {"max_tokens": 64}}).model.max_tokens == 64
    assert scenario({}).model.max_tokens == 48


# --- prepare --------------------------------------------------------------------------
def test_personas_file_sets_agents_and_digest(tmp_path):
    pf = personas_file(tmp_path, 6)
    sc = write(tmp_path, "s.yaml", "rounds: 2\nprompt: {population_note: true}\npopulation: {personas: p.jsonl}\n")
    prep = prepare_file(sc)
    assert prep.config.agents == 6
    assert prep.config.population.digest == digest_of(pf.read_bytes()) == digest_of(prep.personas)
    m = prep.manifest
    assert m["population"]["count"] == 6 and m["population"]["digest"] == prep.config.population.digest
    assert "The players are 6 people. Education: 50% Ph.D., 50% high school." in m["prompt"]["system"]
    assert m["prompt"]["user_example"].startswith("You are P0")
    assert m["seeds"]["population"] == 3
    assert m["scenario"]["text"] == sc.read_text()
    assert "pydantic" in m["software"]["packages"]


def test_agents_must_match_the_personas_file(tmp_path):
    personas_file(tmp_path, 6)
    sc = write(tmp_path, "s.yaml", "agents: 7\npopulation: {personas: p.jsonl}\n")
    with pytest.raises(ScenarioError, match=r"^agents: 7, but population.personas .* has 6 personas"):
        prepare_file(sc)


def test_missing_or_bad_personas_file_names_the_field(tmp_path):
    sc = write(tmp_path, "s.yaml", "population: {personas: nope.jsonl}\n")
    with pytest.raises(ScenarioError, match=r"^population.personas: cannot read"):
        prepare_file(sc)
    write(tmp_path, "bad.jsonl", '{"profile": 3}\n')
    sc = write(tmp_path, "s.yaml", "population: {personas: bad.jsonl}\n")
    with pytest.raises(ScenarioError, match=r"^population.personas: .*bad.jsonl:1"):
        prepare_file(sc)


def test_population_config_builds_template_personas_with_exact_quotas(tmp_path):
    sc = write(tmp_path, "s.yaml", f"agents: 100\npopulation: {{config: {EDUCATION}}}\n")
    prep = prepare_file(sc)
    records = [json.loads(x) for x in prep.personas.decode().splitlines()]
    assert len(records) == 100
    counts = {}
    for r in records:
        counts[r["profile"]["education"]] = counts.get(r["profile"]["education"], 0) + 1
    assert set(counts.values()) == {20}
    # without `agents`, the population's own total
    assert prepare_file(write(tmp_path, "t.yaml", f"population: {{config: {EDUCATION}}}\n")).config.agents == 50


def test_bad_population_config_names_the_field(tmp_path):
    bad = write(tmp_path, "pop.yaml", "total: 10\nattributes:\n  education:\n    weights: {a: 0.5, b: 0.6}\n")
    sc = write(tmp_path, "s.yaml", "population: {config: pop.yaml}\n")
    with pytest.raises(ScenarioError) as err:
        prepare_file(sc)
    text = str(err.value)
    assert text.startswith(f"population.config: {bad} is not a valid population:")
    assert "\n  attributes.education.weights: weights must sum to 1" in text


def test_population_note_without_population_is_an_error():
    with pytest.raises(ScenarioError, match="^prompt.population_note"):
        prepare(RunConfig.model_validate({"prompt": {"population_note": True}}))


def test_manifest_hash_follows_the_config():
    a = prepare(RunConfig(seed=1)).manifest
    b = prepare(RunConfig(seed=2)).manifest
    assert a["config_hash"] != b["config_hash"]
    assert a["config_hash"] == prepare(RunConfig(seed=1)).manifest["config_hash"]
    assert a["prompt"]["version"] and a["model"]["backend"] == "dummy"


# --- sweeps ---------------------------------------------------------------------------
def test_grid_times_seeds_expands_to_validated_runs(tmp_path):
    spec = parse_sweep({"base": {"rounds": 2}, "grid": {"game.ratio": ["2/3", "1/2"],
                                                         "prompt.answer": ["direct", "cot"]},
                        "seeds": [1, 2, 3]})
    cells = expand(spec, dict(spec.base))
    assert len(cells) == 12
    assert {(c.config.params["game"]["ratio"], c.config.params["prompt"]["answer"]) for c in cells} == {
        ("2/3", "direct"), ("2/3", "cot"), ("1/2", "direct"), ("1/2", "cot")}
    assert all(c.config.seed == c.seed == c.config.model.seed for c in cells)
    assert all(c.config.rounds == 2 for c in cells)
    assert cells[0].label == "game.ratio=2/3, prompt.answer=direct"


def test_sweep_merges_base_onto_the_named_scenario_and_rebases_paths(tmp_path):
    (tmp_path / "sub").mkdir()
    personas_file(tmp_path / "sub", 4)
    write(tmp_path / "sub", "scenario.yaml",
          "rounds: 5\nmodel: {backend: dummy, latency_s: 0.2}\npopulation: {personas: p.jsonl}\n")
    sw = write(tmp_path, "sweep.yaml", "scenario: sub/scenario.yaml\nbase: {model: {latency_s: 0.01}}\n"
                                       "grid: {prompt.system: [basic, rational]}\n")
    spec, base = load_sweep(sw)
    cells = expand(spec, base)
    assert [c.config.model.latency_s for c in cells] == [0.01, 0.01]
    assert cells[0].config.rounds == 5
    prep = prepare(cells[0].config, base=tmp_path)  # path was made absolute: found from here
    assert prep.config.agents == 4


@pytest.mark.parametrize("data, starts", [
    ({"grid": {"game..ratio": ["1/2"]}}, "grid: "),
    ({"grid": {"seed": [1, 2]}}, "grid: "),
    ({"grid": {"game.ratio": []}}, "grid.game.ratio: "),
    ({"seeds": []}, "seeds: "),
    ({"seeds": [True]}, "seeds.0: "),
    ({"experiments": 3}, "experiments: unknown key"),
])
def test_bad_sweeps_name_the_field(data, starts):
    with pytest.raises(ScenarioError) as err:
        parse_sweep(data)
    assert str(err.value).startswith(starts), str(err.value)


def test_a_bad_grid_value_names_the_cell_and_the_field(tmp_path):
    sw = write(tmp_path, "sweep.yaml", 'grid: {game.ratio: ["2/3", "zero"]}\n')
    with pytest.raises(ScenarioError, match=r"grid.game.ratio = zero:\ngame.ratio: "):
        plan(sw)
    sw = write(tmp_path, "sweep.yaml", "grid: {colour: [red]}\n")  # not a key of the scenario's simulation
    with pytest.raises(ScenarioError, match=r"grid.colour = red:\ncolour: unknown key"):
        plan(sw)
    with pytest.raises(ScenarioError, match=r"grid.agents = 0:\nagents: "):  # platform keys fail at expand
        expand(parse_sweep({"grid": {"agents": [1, 0]}}), {})


def test_too_many_runs_is_an_error():
    spec = parse_sweep({"grid": {"rounds": list(range(1, 101)), "agents": list(range(1, 101))}, "seeds": [1, 2]})
    with pytest.raises(ScenarioError, match="^grid: 20000 runs is too many"):
        expand(spec, {})


def test_a_scenario_without_simulation_says_which_one_it_is_played_as():
    with pytest.raises(ScenarioError, match=r"(?s)^game.endowment: unknown key.*names no `simulation:`, "
                                            r"so it is played as ratio-game"):
        scenario({"game": {"endowment": 20}})


def test_each_sweep_run_is_named_after_its_cell_not_the_base_scenario():
    spec = parse_sweep({"name": "ratios", "base": {"name": "guess-two-thirds", "rounds": 2},
                        "grid": {"game": [{"ratio": "2/3"}, {"ratio": "1/2", "offset": 5}]}, "seeds": [1, 2]})
    names = [c.config.name for c in expand(spec, spec.base)]
    assert names == ["ratios: game={ratio: 2/3}, seed 1", "ratios: game={ratio: 2/3}, seed 2",
                     "ratios: game={ratio: 1/2, offset: 5}, seed 1", "ratios: game={ratio: 1/2, offset: 5}, seed 2"]
    # a grid over the name itself keeps the names it gives; a long cell stays within the field's limit
    named = parse_sweep({"grid": {"name": ["a", "b"]}})
    assert [c.config.name for c in expand(named, {})] == ["a", "b"]
    long = parse_sweep({"name": "x" * 150, "grid": {"game.ratio": ["1/" + "9" * 60]}})
    assert len(expand(long, {})[0].config.name) == 200
