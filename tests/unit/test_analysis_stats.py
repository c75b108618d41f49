"""populace.analysis.stats and the group labelling: hand-computed values, no database."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from populace.analysis import AnalysisError, equilibrium, mean_ci, summary
from populace.analysis.queries import NONE_GROUP, _labels_for
from populace.analysis.report import game_text, shown_rounds

# Student-t quantiles from tables: t(0.975, 3), t(0.95, 3), t(0.975, 1)
T975_3 = 3.182446305284263
T95_3 = 2.353363434801823
T975_1 = 12.706204736174706


def test_summary_hand_computed():
    s = summary([1, 2, 3, 4])
    assert s["n"] == 4
    assert s["mean"] == pytest.approx(2.5)
    assert s["median"] == pytest.approx(2.5)
    # sample variance: (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3
    assert s["std"] == pytest.approx(math.sqrt(5 / 3))
    assert (s["min"], s["max"]) == (1.0, 4.0)


def test_summary_drops_invalid_and_small_samples():
    s = summary([10, None, 30, float("nan")])
    assert s["n"] == 2 and s["mean"] == pytest.approx(20) and s["median"] == pytest.approx(20)
    assert s["std"] == pytest.approx(math.sqrt(200))
    one = summary([7])
    assert one["n"] == 1 and one["mean"] == 7 and one["std"] is None and one["min"] == one["max"] == 7
    empty = summary([])
    assert empty == {"n": 0, "mean": None, "median": None, "std": None, "min": None, "max": None}


def test_mean_ci_against_known_t_quantile():
    ci = mean_ci([1, 2, 3, 4])
    half = T975_3 * math.sqrt(5 / 3) / 2
    assert ci["n"] == 4 and ci["mean"] == pytest.approx(2.5)
    assert ci["low"] == pytest.approx(2.5 - half, rel=1e-9)
    assert ci["high"] == pytest.approx(2.5 + half, rel=1e-9)
    assert ci["low"] == pytest.approx(0.4457397432, rel=1e-8)  # worked by hand
    ci90 = mean_ci([1, 2, 3, 4], level=0.90)
    assert ci90["high"] - ci90["mean"] == pytest.approx(T95_3 * math.sqrt(5 / 3) / 2, rel=1e-9)
    two = mean_ci([10, 20])  # df = 1: a very wide interval
    assert two["high"] - two["mean"] == pytest.approx(T975_1 * math.sqrt(50) / math.sqrt(2), rel=1e-9)


def test_mean_ci_degenerate_cases():
    one = mean_ci([42])
    assert one["mean"] == 42 and one["low"] is None and one["high"] is None and one["n"] == 1
    assert mean_ci([None])["mean"] is None
    flat = mean_ci([5, 5, 5])
    assert flat["low"] == flat["high"] == flat["mean"] == 5
    with pytest.raises(AnalysisError, match="level"):
        mean_ci([1, 2], level=95)


@pytest.mark.parametrize(("ratio", "offset", "max_value", "expected"), [
    ("2/3", 0, 100, 0.0),
    ("51/100", 0, 100, 0.0),
    ("1/2", 5, 100, 10.0),          # 5 + ½·mean → 10
    (0.5, 5, 100, 10.0),
    (Fraction(1, 2), 60, 100, 100.0),  # fixed point 120, clipped to max
    ("2/3", -10, 100, 0.0),          # fixed point negative, clipped to 0
    ("3/2", 0, 100, 100.0),          # ratio > 1: everyone at the maximum
    ("3/2", -60, 100, None),         # ratio > 1 and max undershoots: no unique equilibrium
    ("1", 0, 100, None),             # every common value is an equilibrium
    ("1", 3, 100, 100.0),
])
def test_equilibrium(ratio, offset, max_value, expected):
    got = equilibrium(ratio, offset, max_value)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_equilibrium_rejects_bad_ratio():
    with pytest.raises(AnalysisError, match="ratio"):
        equilibrium("two thirds")


def test_group_labels_order_education_by_rank_and_none_last():
    values = ["Ph.D.", "high school", "master's", "elementary school", "bachelor's"]
    mapping, order = _labels_for("education", values)
    assert order == ["elementary school", "high school", "bachelor's", "master's", "Ph.D.", NONE_GROUP]
    assert mapping[None] == NONE_GROUP
    # occupations are not ordinal: alphabetical ("doctor" must not be ranked as a Ph.D.)
    _, order = _labels_for("occupation", ["teacher", "doctor", "artist", "game theory professor"])
    assert order[:4] == ["artist", "doctor", "game theory professor", "teacher"]


def test_group_labels_bin_ages_by_decade():
    mapping, order = _labels_for("age", [17, 18, 29, 30, 45, 79, 80, 93])
    assert [mapping[a] for a in (17, 18, 29, 30, 45, 79, 80, 93)] == [
        "under 18", "18-29", "18-29", "30-39", "40-49", "70-79", "80+", "80+"]
    assert order == ["under 18", "18-29", "30-39", "40-49", "70-79", "80+", NONE_GROUP]


def test_group_labels_other_numbers():
    mapping, order = _labels_for("children", [0, 2, 1, 3])
    assert order[:4] == ["0", "1", "2", "3"]
    mapping, order = _labels_for("income", list(range(101)))
    assert order[:-1] == ["0-19", "20-39", "40-59", "60-79", "80-100"]
    assert mapping[100] == "80-100" and mapping[19] == "0-19" and mapping[20] == "20-39"


def test_game_text_keeps_the_ratio_as_written():
    assert game_text({"ratio": "2/3", "offset": 0.0, "max_value": 100.0}) == "target = 2/3 · mean; guesses in [0, 100]"
    assert game_text({"ratio": "1/2", "offset": 5.0, "max_value": 100.0}).startswith("target = 1/2 · mean + 5")


def test_shown_rounds_caps_panels():
    assert shown_rounds([1, 2, 3]) == [1, 2, 3]
    assert shown_rounds(list(range(1, 11))) == [1, 2, 3, 8, 9, 10]
