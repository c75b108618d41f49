"""The ratio game's parameters (the scenario's `game:` and `prompt:` sections)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from populace_ratio_game.params import COT_MAX_TOKENS, GameConfig, parse_ratio
from pydantic import ValidationError

from populace.core.contracts import RunConfig
from populace.sdk.registry import resolve


@pytest.mark.parametrize("raw,value,fraction", [
    ("2/3", 2 / 3, Fraction(2, 3)),
    (" 2/3 ", 2 / 3, Fraction(2, 3)),
    ("51/100", 0.51, Fraction(51, 100)),
    (0.5, 0.5, Fraction(1, 2)),
    ("0.5", 0.5, Fraction(1, 2)),
    (2, 2.0, Fraction(2)),
    ("1", 1.0, Fraction(1)),
])
def test_ratio_accepted(raw, value, fraction):
    g = GameConfig(ratio=raw)
    assert g.ratio_value == pytest.approx(value, rel=1e-15)
    assert g.ratio_fraction == fraction
    assert isinstance(g.ratio, str)
    assert parse_ratio(raw) == fraction


@pytest.mark.parametrize("raw", [0, -1, 0.0, -0.5, "0", "-2/3", "0/5", "abc", "", "1/0", "2/3/4",
                                 True, False, None, [2, 3], float("inf"), float("nan"), "nan", "inf"])
def test_ratio_rejected(raw):
    with pytest.raises(ValidationError) as exc:
        GameConfig(ratio=raw)
    assert exc.value.errors()[0]["loc"] == ("ratio",)
    with pytest.raises(ValueError):
        parse_ratio(raw)


@pytest.mark.parametrize("field,value", [("offset", float("inf")), ("offset", float("nan")),
                                         ("max_value", 0), ("max_value", -1), ("max_value", float("inf")),
                                         ("history_window", -1), ("history_window", 101)])
def test_game_config_bounds(field, value):
    with pytest.raises(ValidationError):
        GameConfig(**{field: value})


def test_errors_name_the_field_as_the_scenario_wrote_it():
    with pytest.raises(ValidationError) as exc:
        resolve(RunConfig(game={"ratio": "two thirds"}))
    assert exc.value.errors()[0]["loc"] == ("game", "ratio")
    with pytest.raises(ValidationError) as exc:
        resolve(RunConfig(agnets=5))  # a typo of a platform key lands with the simulation's keys
    assert exc.value.errors()[0]["loc"] == ("agnets",) and exc.value.errors()[0]["type"] == "extra_forbidden"


def test_defaults_are_filled_in_and_cot_gets_room_to_think():
    r = resolve(RunConfig())
    assert r.config.params == {"game": {"ratio": "2/3", "offset": 0.0, "max_value": 100.0, "history_window": 5},
                               "prompt": {"system": "basic", "answer": "direct", "persona": True,
                                          "population_note": False}}
    assert r.config.model.max_tokens == 48
    assert resolve(RunConfig(prompt={"answer": "cot"})).config.model.max_tokens == COT_MAX_TOKENS
    # unless the scenario set it
    assert resolve(RunConfig(prompt={"answer": "cot"}, model={"max_tokens": 64})).config.model.max_tokens == 64


def test_population_note_needs_a_population():
    with pytest.raises(ValidationError, match="prompt.population_note: needs a `population`"):
        resolve(RunConfig(prompt={"population_note": True}))
