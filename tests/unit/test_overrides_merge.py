"""One deep merge of overrides (populace.core.scenario.merged) for `--set`, the Python API,
sweeps and forks: a mapping changes the keys it names and keeps the scenario's others."""

from __future__ import annotations

from pathlib import Path

from populace.client.api import prepare_scenario, simulate
from populace.client.prepare import prepare_file, prepare_fork
from populace.client.steer import overrides
from populace.core.scenario import merged

ROOT = Path(__file__).resolve().parents[2]
FIVE_PLUS_HALF = ROOT / "examples" / "five-plus-half.yaml"  # game: {ratio: "1/2", offset: 5, max_value: 100}


def _game(prepared) -> dict:
    return prepared.config.model_dump(mode="json")["game"]


def test_simulate_merges_a_section_like_set_and_keeps_the_scenarios_other_keys():
    result = simulate(FIVE_PLUS_HALF, local=True, agents=20, rounds=1, game={"ratio": "2/3"})
    game = result.config.model_dump(mode="json")["game"]
    assert game["ratio"] == "2/3"
    assert (game["offset"], game["max_value"]) == (5, 100)  # a shallow merge dropped these


def test_the_api_and_set_build_the_same_config():
    by_set = prepare_scenario(FIVE_PLUS_HALF, overrides(["game.ratio=2/3", "rounds=2"]))
    by_api = prepare_scenario(FIVE_PLUS_HALF, {"game": {"ratio": "2/3"}, "rounds": 2})
    assert by_set.config == by_api.config
    assert _game(by_api) == {**_game(prepare_file(FIVE_PLUS_HALF)), "ratio": "2/3"}


def test_a_mapping_or_config_scenario_merges_the_same_way():
    data = {"simulation": "ratio-game", "agents": 10, "game": {"ratio": "1/2", "offset": 5}}
    from_mapping = prepare_scenario(data, {"game": {"ratio": "2/3"}})
    from_config = prepare_scenario(prepare_file(FIVE_PLUS_HALF).config, {"game": {"ratio": "2/3"}})
    assert _game(from_mapping)["offset"] == 5 and _game(from_mapping)["ratio"] == "2/3"
    assert _game(from_config)["offset"] == 5 and _game(from_config)["max_value"] == 100


def test_a_fork_merges_its_change_into_the_parents_config():
    parent = prepare_file(FIVE_PLUS_HALF).config
    fork = prepare_fork(parent, 1, {"game": {"ratio": "2/3"}})
    assert _game(fork) == {**parent.model_dump(mode="json")["game"], "ratio": "2/3"}


def test_merged_changes_neither_input_and_replaces_what_is_not_a_mapping():
    base = {"game": {"ratio": "1/2", "offset": 5}, "tags": [1]}
    extra = {"game": {"ratio": "2/3"}, "tags": [2], "rounds": 3}
    out = merged(base, extra)
    assert out == {"game": {"ratio": "2/3", "offset": 5}, "tags": [2], "rounds": 3}
    assert base == {"game": {"ratio": "1/2", "offset": 5}, "tags": [1]}
    out["tags"].append(9)
    assert extra["tags"] == [2]  # the result holds copies, not the caller's values
