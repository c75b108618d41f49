"""What `populace simulations` and `populace validate` print, value by value (in process: the `cli`
fixture): each installed simulation's class, tables and grouping; the scenario as it will run,
defaults filled in and the population's digest computed."""

from __future__ import annotations

import json
from pathlib import Path

from populace.core.objects import digest_of

ROOT = Path(__file__).resolve().parents[2]


def test_simulations_lists_each_ones_class_tables_and_groups(cli):
    res = cli("simulations", env={"COLUMNS": "250"})
    assert res.returncode == 0, res.stderr
    rows = {cells[0]: cells[1:] for line in res.stdout.splitlines() if line.startswith("│")
            for cells in [[c.strip() for c in line.strip("│").split("│")]]}
    assert rows["ratio-game"] == ["populace_ratio_game:RatioGame", "guesses", "rounds", "no"]
    assert rows["vote"] == ["populace_vote:Vote", "votes", "vote_rounds", "no"]
    assert rows["public-goods"] == ["populace_public_goods:PublicGoods", "public_goods_outcomes",
                                    "public_goods_rounds", "yes"]


def test_validate_prints_the_scenario_as_it_will_run(cli, tmp_path):
    population = ROOT / "examples" / "population" / "education.yaml"
    (tmp_path / "s.yaml").write_text(f"name: t\nagents: 50\nrounds: 2\npopulation: {{config: {population}}}\n"
                                     "model: {backend: dummy, latency_s: 0.001}\ngame: {ratio: 1/2, offset: 5}\n")
    res = cli("validate", tmp_path / "s.yaml")
    assert res.returncode == 0, res.stderr
    config = json.loads(res.stdout)
    assert (config["simulation"], config["agents"], config["rounds"], config["seed"]) == ("ratio-game", 50, 2, 0)
    assert config["model"] == {"backend": "dummy", "latency_s": 0.001, "seed": 0, "name": None, "max_tokens": 48,
                               "temperature": 0.7}
    assert config["game"] == {"ratio": "1/2", "offset": 5.0, "max_value": 100.0, "history_window": 5}
    # the digest of the 50 personas the config makes: those `personas generate` writes for it
    assert cli("personas", "generate", population, "--count", "50", "--out", tmp_path / "p.jsonl").returncode == 0
    assert config["population"]["digest"] == digest_of((tmp_path / "p.jsonl").read_bytes())
