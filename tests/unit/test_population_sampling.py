"""Profile sampling: exact quotas and weights, conditional structure, seeds, numeric bounds."""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from fractions import Fraction
from itertools import pairwise
from pathlib import Path

import pytest

from populace.population import (
    largest_remainder,
    load_population,
    parse_population,
    sample_profiles,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "population"
LEVELS = ["elementary school", "high school", "bachelor's", "master's", "Ph.D."]
TOTALS = [1, 7, 50, 99, 1000, 100_000]


def config(attributes: dict, total: int = 100, seed: int = 0):
    return parse_population({"name": "t", "total": total, "seed": seed,
                             "attributes": attributes})


# ----------------------------------------------------------------------------- allocation

def test_largest_remainder_basics():
    assert largest_remainder([1, 1, 1], 10) == [4, 3, 3]  # tie goes to the first
    assert largest_remainder([0.2] * 5, 50) == [10] * 5
    assert largest_remainder([0.2] * 5, 7) == [2, 2, 1, 1, 1]
    assert largest_remainder([0.5, 0.0, 0.5], 3) == [2, 0, 1]
    assert largest_remainder([3, 0, 7], 10) == [3, 0, 7]  # exact quotas unchanged
    assert largest_remainder([0.7, 0.2, 0.1], 0) == [0, 0, 0]


def test_largest_remainder_properties():
    rng = random.Random(1)
    for _ in range(300):
        k = rng.randint(1, 8)
        w = [rng.random() for _ in range(k)]
        if k > 1 and rng.random() < 0.3:
            w[rng.randrange(k)] = 0.0
        n = rng.randint(0, 10_000)
        counts = largest_remainder(w, n)
        assert sum(counts) == n
        total = sum(Fraction(x) for x in w)
        for c, x in zip(counts, w):
            share = Fraction(x) * n / total
            assert math.floor(share) <= c <= math.ceil(share)
            if x == 0:
                assert c == 0


# ----------------------------------------------------------------------------- categorical

@pytest.mark.parametrize("total", TOTALS)
def test_quotas_met_exactly_at_their_total(total):
    quotas = dict(zip("abcde", largest_remainder([0.37, 0.05, 0.28, 0.3, 0.0], total)))
    cfg = config({"g": {"quotas": quotas}}, total=total)
    profiles = sample_profiles(cfg)
    assert len(profiles) == total
    got = Counter(p["g"] for p in profiles)
    assert {k: got.get(k, 0) for k in quotas} == quotas


@pytest.mark.parametrize("count", TOTALS)
def test_education_example_quotas_scale_exactly(count):
    cfg = load_population(EXAMPLES / "education.yaml")
    profiles = sample_profiles(cfg, count)
    assert len(profiles) == count
    got = Counter(p["education"] for p in profiles)
    expected = dict(zip(LEVELS, largest_remainder([1] * 5, count)))
    assert {k: got.get(k, 0) for k in LEVELS} == expected
    if count % 5 == 0:
        assert set(got.values()) == {count // 5}


def test_paper_counts_50_and_100k():
    cfg = load_population(EXAMPLES / "education.yaml")
    assert Counter(p["education"] for p in sample_profiles(cfg, 50)) == dict.fromkeys(LEVELS, 10)
    big = sample_profiles(cfg, 100_000)
    assert Counter(p["education"] for p in big) == dict.fromkeys(LEVELS, 20_000)


@pytest.mark.parametrize("n", [50, 100_000])
def test_equal_weights_are_exact(n):
    cfg = config({"education": {"weights": dict.fromkeys(LEVELS, 0.2)}})
    got = Counter(p["education"] for p in sample_profiles(cfg, n))
    assert got == dict.fromkeys(LEVELS, n // 5)


def test_uneven_weights_follow_largest_remainder():
    w = {"a": 0.5, "b": 0.3, "c": 0.2}
    cfg = config({"g": {"weights": w}})
    for n in (1, 2, 3, 7, 11, 999):
        got = Counter(p["g"] for p in sample_profiles(cfg, n))
        assert [got.get(k, 0) for k in w] == largest_remainder(list(w.values()), n)


def test_values_are_shuffled_not_blocked():
    cfg = config({"g": {"weights": {"a": 0.5, "b": 0.5}}})
    values = [p["g"] for p in sample_profiles(cfg, 1000)]
    assert values[:500] != ["a"] * 500
    runs = sum(1 for x, y in pairwise(values) if x != y)
    assert 350 < runs < 650  # ~500 for a random order


# ----------------------------------------------------------------------------- conditional

@pytest.mark.parametrize("count", [None, 1, 7, 99, 1000])
def test_conditional_structure_and_exact_group_proportions(count):
    cfg = load_population(EXAMPLES / "occupation.yaml")
    cond_name, cond = next((n, a) for n, a in cfg.attributes.items() if a.kind == "conditional")
    parent = cond.given
    profiles = sample_profiles(cfg, count)
    assert len(profiles) == (count or cfg.total)
    groups: dict[str, Counter] = {}
    for p in profiles:
        groups.setdefault(p[parent], Counter())[p[cond_name]] += 1
    for parent_cat, children in groups.items():
        weights = cond.weights_by[parent_cat]
        allowed = {c for c, w in weights.items() if w > 0}
        assert set(children) <= allowed
        size = sum(children.values())
        expected = largest_remainder(list(weights.values()), size)
        assert [children.get(c, 0) for c in weights] == expected


def test_occupation_example_six_groups_of_100():
    cfg = load_population(EXAMPLES / "occupation.yaml")
    profiles = sample_profiles(cfg)
    occ = Counter(p["occupation"] for p in profiles)
    assert len(occ) == 6 and set(occ.values()) == {100}
    professors = {p["education"] for p in profiles if p["occupation"] == "game theory professor"}
    assert professors == {"Ph.D."}


def test_conditional_on_weighted_parent_and_chain():
    cfg = config({
        "e": {"weights": {"lo": 0.3, "hi": 0.7}},
        "o": {"given": "e", "weights_by": {"lo": {"x": 0.5, "y": 0.5},
                                           "hi": {"y": 0.25, "z": 0.75}}},
        "s": {"given": "o", "weights_by": {"x": {"p": 1.0}, "y": {"q": 1.0},
                                           "z": {"p": 0.5, "q": 0.5}}},
    })
    profiles = sample_profiles(cfg, 1000)
    pairs = Counter((p["e"], p["o"]) for p in profiles)
    assert pairs == {("lo", "x"): 150, ("lo", "y"): 150, ("hi", "y"): 175, ("hi", "z"): 525}
    for p in profiles:
        if p["o"] == "x":
            assert p["s"] == "p"
        if p["o"] == "y":
            assert p["s"] == "q"
    assert Counter(p["s"] for p in profiles if p["o"] == "z") == {"p": 263, "q": 262}


# ----------------------------------------------------------------------------- determinism

def test_same_seed_same_profiles_and_different_seed_differs():
    cfg = load_population(EXAMPLES / "occupation.yaml")
    a = sample_profiles(cfg)
    assert a == sample_profiles(cfg)
    other = cfg.model_copy(update={"seed": cfg.seed + 1})
    b = sample_profiles(other)
    assert a != b
    assert b == sample_profiles(cfg, seed=cfg.seed + 1)
    # same marginals whatever the seed
    assert Counter(p["occupation"] for p in a) == Counter(p["occupation"] for p in b)


def test_adding_an_attribute_keeps_the_others():
    base = {"g": {"weights": {"a": 0.5, "b": 0.5}},
            "age": {"uniform": {"min": 0, "max": 1}}}
    a = sample_profiles(config(base), 200)
    b = sample_profiles(config({**base, "extra": {"weights": {"x": 1.0}}}), 200)
    assert [(p["g"], p["age"]) for p in a] == [(p["g"], p["age"]) for p in b]


def test_profile_keys_follow_declaration_order():
    cfg = load_population(EXAMPLES / "occupation.yaml")
    assert list(sample_profiles(cfg, 1)[0]) == list(cfg.attributes)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_count(bad):
    cfg = config({"g": {"weights": {"a": 1.0}}})
    with pytest.raises(ValueError):
        sample_profiles(cfg, bad)


# ----------------------------------------------------------------------------- numeric

def test_uniform_bounds_float_and_integer():
    cfg = config({"f": {"uniform": {"min": -2.5, "max": 3.5}},
                  "i": {"uniform": {"min": 1.5, "max": 4.5}, "integer": True}})
    profiles = sample_profiles(cfg, 5000)
    f = [p["f"] for p in profiles]
    assert all(-2.5 <= x <= 3.5 for x in f) and all(isinstance(x, float) for x in f)
    assert abs(statistics.fmean(f) - 0.5) < 0.15
    assert {p["i"] for p in profiles} == {2, 3, 4}


def test_normal_is_truncated_not_clipped():
    cfg = config({"age": {"normal": {"mean": 40, "std": 14, "min": 18, "max": 80}}})
    ages = [p["age"] for p in sample_profiles(cfg, 20_000)]
    assert all(18 <= a <= 80 for a in ages)
    assert ages.count(18.0) == 0 and ages.count(80.0) == 0  # no pile-up at the bounds
    nd = statistics.NormalDist()
    a, b = (18 - 40) / 14, (80 - 40) / 14
    z = nd.cdf(b) - nd.cdf(a)
    expected_mean = 40 + 14 * (nd.pdf(a) - nd.pdf(b)) / z  # truncated-normal mean, ~41.6
    assert abs(statistics.fmean(ages) - expected_mean) < 0.3
    assert 11 < statistics.pstdev(ages) < 14


def test_normal_with_far_bounds_uses_the_tail():
    cfg = config({"x": {"normal": {"mean": 0, "std": 1, "min": 3, "max": 3.5}}})
    xs = [p["x"] for p in sample_profiles(cfg, 2000)]
    assert all(3 <= x <= 3.5 for x in xs)
    assert statistics.fmean(xs) < 3.25  # mass falls with distance from the mean


def test_integer_normal():
    cfg = load_population(EXAMPLES / "education.yaml")
    ages = [p["age"] for p in sample_profiles(cfg, 10_000)]
    assert all(isinstance(a, int) and 18 <= a <= 80 for a in ages)


def test_bins_exact_counts_and_bounds():
    cfg = config({"age": {"bins": [{"min": 18, "max": 29, "weight": 0.25},
                                   {"min": 30, "max": 49, "weight": 0.5},
                                   {"min": 50, "max": 80, "weight": 0.25}],
                          "integer": True},
                  "h": {"bins": [{"min": 1.0, "max": 2.0, "weight": 0.1},
                                 {"min": 2.0, "max": 3.0, "weight": 0.9}]}})
    profiles = sample_profiles(cfg, 1000)
    ages = [p["age"] for p in profiles]
    assert sum(18 <= a <= 29 for a in ages) == 250
    assert sum(30 <= a <= 49 for a in ages) == 500
    assert sum(50 <= a <= 80 for a in ages) == 250
    assert min(ages) == 18 and max(ages) == 80
    hs = [p["h"] for p in profiles]
    assert all(1.0 <= x <= 3.0 for x in hs)
    assert sum(x < 2.0 for x in hs) == 100


# ------------------------------------------------------------------------- large N
# (speed is measured by benchmarks, never asserted in tests)

def test_100k_profiles_are_exact():
    cfg = load_population(EXAMPLES / "occupation.yaml")
    profiles = sample_profiles(cfg, 100_000)
    assert len(profiles) == 100_000
