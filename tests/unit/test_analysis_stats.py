"""populace.analysis.stats and the group labelling: hand-computed values, no database."""

from __future__ import annotations

import math

import pytest

from populace.analysis import AnalysisError, mean_ci, share_ci, summary, wilson_interval
from populace.analysis.queries.attribute_groups import NONE_GROUP, _labels_for
from populace.analysis.queries.sql_parts import _leader
from populace.analysis.report import describe, histogram_bins, params_text, shown_rounds
from populace.analysis.tables import plural

# Student-t quantiles from tables: t(0.975, 3), t(0.95, 3), t(0.975, 1)
T975_3 = 3.182446305284263
T95_3 = 2.353363434801823
T975_1 = 12.706204736174706
Z975 = 1.959963984540054  # standard normal quantile 0.975


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


def test_describe_prefers_the_simulations_own_words():
    assert describe({"description": "target = 2/3 · mean", "simulation": "s", "params": {"a": 1}}) == \
        "target = 2/3 · mean"
    assert describe({"description": None, "simulation": "vote", "params": {"ballot": {"question": "Q?"}}}) == \
        "vote: ballot.question=Q?"


def test_shown_rounds_caps_panels():
    assert shown_rounds([1, 2, 3]) == [1, 2, 3]
    assert shown_rounds(list(range(1, 11))) == [1, 2, 3, 8, 9, 10]


def _wilson_by_hand(k: int, n: int, z: float = Z975) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def test_wilson_interval_against_published_values():
    # Brown, Cai & DasGupta (2001) and every textbook table: 0/10 → [0, 0.2775], 5/10 → [0.2366, 0.7634]
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.27753279986, rel=1e-9))
    low, high = wilson_interval(5, 10)
    assert (low, high) == (pytest.approx(0.23659309, rel=1e-7), pytest.approx(0.76340691, rel=1e-7))
    for k, n in ((1, 20), (7, 9), (37, 120), (999, 1000)):
        assert wilson_interval(k, n) == pytest.approx(_wilson_by_hand(k, n), rel=1e-12)


def test_wilson_interval_is_not_walds():
    # Wald collapses at 0 and 1 (0/10 → [0, 0]) and leaves [0, 1] near them; Wilson does neither
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high > 0.2
    low, high = wilson_interval(1, 10)
    wald_low = 0.1 - Z975 * math.sqrt(0.1 * 0.9 / 10)
    assert wald_low < 0 < low
    assert wilson_interval(10, 10) == (pytest.approx(1 - 0.27753279986, rel=1e-9), 1.0)


def test_wilson_interval_symmetry_level_and_width():
    for k, n in ((3, 17), (0, 4), (12, 12)):
        low, high = wilson_interval(k, n)
        mlow, mhigh = wilson_interval(n - k, n)
        assert (low, high) == (pytest.approx(1 - mhigh, abs=1e-12), pytest.approx(1 - mlow, abs=1e-12))
    z90 = 1.6448536269514722
    assert wilson_interval(37, 120, level=0.90) == pytest.approx(_wilson_by_hand(37, 120, z90), rel=1e-12)
    w95 = wilson_interval(37, 120)
    w90 = wilson_interval(37, 120, level=0.90)
    assert w95[0] < w90[0] < w90[1] < w95[1]  # a lower level is a narrower interval
    # more data, narrower interval around the same share
    assert wilson_interval(370, 1200)[1] - wilson_interval(370, 1200)[0] < w95[1] - w95[0]


def test_wilson_interval_degenerate_and_bad_input():
    assert wilson_interval(0, 0) == (None, None)
    assert share_ci(0, 0) == {"share": None, "low": None, "high": None, "k": 0, "n": 0, "level": 0.95}
    ci = share_ci(3, 12)
    assert ci["share"] == 0.25 and ci["low"] < 0.25 < ci["high"] and (ci["k"], ci["n"]) == (3, 12)
    for k, n in ((5, 4), (-1, 3), (1, -1), (True, 3)):
        with pytest.raises(AnalysisError, match="0 <= k <= n"):
            wilson_interval(k, n)
    with pytest.raises(AnalysisError, match="level"):
        wilson_interval(1, 2, level=1.0)


def test_leader_is_unique_or_none():
    assert _leader({"yes": 5, "no": 3}) == ("yes", 5)
    assert _leader({"yes": 4, "no": 4, "abstain": 1}) == (None, 4)  # a tie has no leader
    assert _leader({"yes": 0, "no": 0}) == (None, 0)
    assert _leader({"a": 2, "(other)": 9}) == ("a", 2)  # the rest of the answers is no option


def test_titles_and_descriptions():
    assert [plural(w) for w in ("guess", "choice", "contribution", "opinion", "reply", "day", "box")] == [
        "guesses", "choices", "contributions", "opinions", "replies", "days", "boxes"]
    assert params_text({}) == ""
    assert params_text({"game": {"endowment": 20, "multiplier": "8/5"}, "prompt": {"answer": "cot"}}) == (
        "game.endowment=20, game.multiplier=8/5, prompt.answer=cot")
    assert params_text({"ballot": {"options": ["yes", "no"]}}) == 'ballot.options=["yes", "no"]'
    assert len(params_text({"q": "x" * 1000})) == 401


def test_histogram_bins():
    assert histogram_bins(0, 100, integer=False) == (0, 100, 20)
    assert histogram_bins(0, 20, integer=True) == (-0.5, 20.5, 21)  # one bar per whole number
    assert histogram_bins(0, 1000, integer=True) == (0, 1000, 20)  # too many values: equal bins
    assert histogram_bins(5, 5, integer=False) == (4.5, 5.5, 20)  # a constant sample still has a width
