"""The round's statistics are exact: any split into batches or hosts, merged in any order,
gives the same summary, and each column is what numpy computes from the raw stances."""

from __future__ import annotations

import random

import numpy as np
import pytest
from populace_opinion import Listened, Opinion, OpinionEnv, Stance
from populace_opinion.hearing import NOTHING_HEARD
from populace_opinion.measures import StanceSums, fold, pearson, summarize
from populace_opinion.scale import MICRO, to_micro

from populace.core.contracts import RunConfig
from populace.sdk import resolve

EXTREME = to_micro(0.8)


def env(extreme: float = 0.8) -> OpinionEnv:
    sim = resolve(RunConfig.model_validate({"simulation": "opinion", "extreme": extreme})).instance()
    return OpinionEnv(sim)


def heard_of(stances: list[float]) -> Listened:
    micro = [to_micro(s) for s in stances]
    return Listened(len(micro), sum(micro), sum(m * m for m in micro))


def outcome(stance: float | None, heard: list[float] = ()) -> Stance:
    out = Stance(stance=stance, heard=len(heard), valid=stance is not None)
    out.listened = heard_of(list(heard))
    return out


def random_outcomes(rng: random.Random, n: int) -> list[Stance]:
    return [outcome(None if rng.random() < 0.1 else round(rng.uniform(-1, 1), rng.choice([1, 2, 6])),
                    [round(rng.uniform(-1, 1), 3) for _ in range(rng.randint(0, 6))]) for _ in range(n)]


@pytest.mark.parametrize("seed", range(20))
def test_any_split_merged_in_any_order_and_grouping_gives_the_same_round(seed):
    rng = random.Random(seed)
    e = env()
    outs = random_outcomes(rng, rng.randint(0, 300))
    whole = e.reduce(range(len(outs)), outs)
    cuts = sorted(rng.sample(range(len(outs) + 1), k=min(5, len(outs) + 1)))
    parts = [e.reduce(range(a, b), outs[a:b]) for a, b in zip([0, *cuts], [*cuts, len(outs)])]
    rng.shuffle(parts)  # commutative
    assert e.merge(parts) == whole
    k = rng.randint(0, len(parts))  # associative: hosts of batches
    assert e.merge([e.merge(parts[:k]), e.merge(parts[k:])]) == whole
    assert e.decide(e.start(), 1, e.merge(parts))[1] == e.decide(e.start(), 1, whole)[1]
    assert whole.n == sum(o.valid for o in outs)


def test_the_partial_survives_the_wire_exactly():
    outs = random_outcomes(random.Random(1), 500)
    whole = env().reduce(range(500), outs)
    assert StanceSums.model_validate_json(whole.model_dump_json()) == whole


def test_nothing_valid_is_an_empty_summary():
    e = env()
    total = e.merge([])
    assert total == StanceSums() and summarize(total).model_dump() == dict.fromkeys(summarize(total).model_dump())
    assert e.reduce([0], [Stance(valid=False, raw="garbage")]) == StanceSums()  # a failed turn's outcome


def test_mean_variance_and_extreme_share_match_numpy():
    stances = [-1.0, -0.8, -0.79, 0.0, 0.3, 0.8, 0.95, 1.0, 0.123457]
    s = summarize(env().reduce(range(len(stances)), [outcome(x) for x in stances]))
    a = np.array(stances)
    assert s.mean_stance == pytest.approx(a.mean(), abs=1e-15)
    assert s.var_stance == pytest.approx(a.var(), abs=1e-15)  # population variance (ddof=0)
    assert s.extreme_share == np.mean(np.abs(a) >= 0.8) == 5 / 9
    assert summarize(env(extreme=0.95).reduce(range(9), [outcome(x) for x in stances])).extreme_share == 3 / 9


@pytest.mark.parametrize(("stances", "expected"), [
    ([-1, -1, 1, 1], 1.0),              # two camps at the ends, equal sizes
    ([1, 1, 1, 1], 0.0),                # one camp
    ([0, 0, 0], 0.0),                   # all neutral
    ([0.2, 0.9, 0.5, 1.0], 0.0),        # spread out but on one side: no polarization
    ([-1, 1, 0, 0], 0.25),              # 2 * 1/4 * 1/4 * 2
    ([-0.5, 0.5], 0.5),                 # 2 * 1/2 * 1/2 * 1
])
def test_polarization_is_the_share_weighted_distance_between_camps(stances, expected):
    s = summarize(env().reduce(range(len(stances)), [outcome(float(x)) for x in stances]))
    assert s.polarization == expected


def test_polarization_matches_its_definition_on_random_stances():
    rng = random.Random(7)
    stances = [round(rng.uniform(-1, 1), 4) for _ in range(101)] + [0.0, 0.0]
    a = np.array(stances)
    pos, neg = a[a > 0], a[a < 0]
    expected = 2 * (pos.size / a.size) * (neg.size / a.size) * (pos.mean() - neg.mean())
    s = summarize(env().reduce(range(a.size), [outcome(x) for x in stances]))
    assert s.polarization == pytest.approx(expected, rel=1e-12)


def test_assortativity_is_pearson_over_the_heard_posts():
    rng = random.Random(3)
    outs, xs, ys = [], [], []
    for _ in range(80):
        x = round(rng.uniform(-1, 1), 2)
        heard = [round(max(-1.0, min(1.0, x + rng.gauss(0, 0.4))), 3) for _ in range(rng.randint(0, 5))]
        outs.append(outcome(x, heard))
        xs += [x] * len(heard)
        ys += heard
    outs.append(outcome(None, [0.9, -0.9]))  # an invalid hearer: its pairs do not count
    s = summarize(env().reduce(range(len(outs)), outs))
    assert s.assortativity == pytest.approx(np.corrcoef(xs, ys)[0, 1], abs=1e-12)
    assert s.assortativity > 0.5


def test_assortativity_is_undefined_without_pairs_or_variance():
    assert summarize(env().reduce([0, 1], [outcome(0.5), outcome(-0.5)])).assortativity is None  # round 1
    same_hearer = [outcome(0.5, [0.1, 0.9]), outcome(0.5, [-0.2])]  # the hearers all agree: no x variance
    assert summarize(env().reduce([0, 1], same_hearer)).assortativity is None
    same_post = [outcome(0.5, [0.3]), outcome(-0.5, [0.3])]
    assert summarize(env().reduce([0, 1], same_post)).assortativity is None
    assert summarize(env().reduce([0, 1], [outcome(1.0, [1.0]), outcome(-1.0, [-1.0])])).assortativity == 1.0
    assert pearson(1, 1, 1, 1, 1, 1) is None


def test_an_outcome_the_platform_built_has_heard_nothing():
    assert Stance(valid=False, raw="<agent error: boom>").listened is NOTHING_HEARD
    assert fold([(None, heard_of([0.5]))], EXTREME) == StanceSums()
    assert MICRO == 1_000_000 and Opinion.Env is OpinionEnv
