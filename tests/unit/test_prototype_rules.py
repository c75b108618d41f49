"""Prototypes' pure rules (populace.population.prototypes): who is in which prototype, who
represents it, who is audited, whom every other agent copies — the same from the same inputs,
whichever process computes it — and the divergences the environment measures (populace.sdk.prototypes)."""

from __future__ import annotations

import numpy as np
import pytest

from populace.population import prototypes as rules
from populace.sdk import prototypes

PROFILES = [{"education": e, "age": a} for e, a in zip(["phd", "high school", "phd", "bachelor"] * 25,
                                                        [30, 40, 50, 60, 70] * 20, strict=True)]


def test_membership_groups_by_attributes_with_sorted_labels():
    m = rules.membership(100, ["education"], PROFILES)
    assert m.labels == ("education=bachelor", "education=high school", "education=phd")
    assert m.sizes.tolist() == [25, 25, 50]
    assert m.of[[0, 1, 3]].tolist() == [2, 1, 0]
    assert m.of_prototype(0).tolist() == list(range(3, 100, 4))  # ascending ids within a prototype
    everyone = rules.membership(7)
    assert everyone.labels == ("all",) and everyone.sizes.tolist() == [7]


def test_membership_refuses_a_missing_attribute_naming_the_field_and_agent():
    with pytest.raises(rules.PrototypeError, match=r"^prototypes\.by: 'income' is not an attribute of agent 0's"):
        rules.membership(100, ["income"], PROFILES)
    with pytest.raises(rules.PrototypeError, match=r"^prototypes\.by: .*no population"):
        rules.membership(100, ["education"], None)


def test_representatives_per_prototype_share_and_minimum():
    m = rules.membership(100, ["education"], PROFILES)
    reps = rules.representatives(m, 0.1, minimum=3, seed=7)
    # ceil(0.1 * 25) = 3, ceil(0.1 * 50) = 5
    assert np.bincount(m.of[reps], minlength=3).tolist() == [3, 3, 5]
    again = rules.representatives(m, 0.1, minimum=3, seed=7)
    assert (reps == again).all()
    assert (reps != rules.representatives(m, 0.1, minimum=3, seed=8)).any()
    # a raised share keeps the representatives there were (a longer prefix of one order)
    raised = rules.representatives(m, np.array([0.1, 0.4, 0.1]), minimum=3, seed=7)
    assert (raised >= reps).all() and np.bincount(m.of[raised], minlength=3).tolist() == [3, 10, 5]
    # drawn again every round: another set per round
    r1 = rules.representatives(m, 0.1, 3, 7, round_=1)
    assert (r1 != rules.representatives(m, 0.1, 3, 7, round_=2)).any()


def test_sources_copy_a_valid_representative_of_the_same_prototype_never_an_invalid_one():
    m = rules.membership(100, ["education"], PROFILES)
    reps = rules.representatives(m, 0.2, minimum=2, seed=1)
    valid = np.ones(100, dtype=bool)
    bad = np.flatnonzero(reps)[:3]
    valid[bad] = False
    src = rules.sources(m, reps, valid, seed=1, round_=4)
    assert (src[reps] == rules.REPRESENTATIVE).all()
    drawn = np.flatnonzero(~reps)
    assert (src[drawn] >= 0).all()
    assert reps[src[drawn]].all() and valid[src[drawn]].all()  # a representative with a valid answer
    assert (m.of[src[drawn]] == m.of[drawn]).all()  # of the agent's own prototype
    assert not set(bad.tolist()) & set(src[drawn].tolist())
    # a prototype whose representatives all answered invalidly has nothing to copy
    valid[np.flatnonzero(reps & (m.of == 0))] = False
    src = rules.sources(m, reps, valid, seed=1, round_=4)
    assert (src[~reps & (m.of == 0)] == rules.NO_SOURCE).all()


def test_draws_are_the_same_whichever_share_tallies_them():
    m = rules.membership(100, ["education"], PROFILES)
    reps = rules.representatives(m, 0.1, 2, 3)
    pool = rules.pools(m, reps)
    others = np.flatnonzero(~reps)
    whole = rules.draw_positions(m, pool, others, 3, 2)
    halves = np.concatenate([rules.draw_positions(m, pool, others[:40], 3, 2),
                             rules.draw_positions(m, pool, others[40:], 3, 2)])
    assert (whole == halves).all()
    counts, first = rules.tally_draws(whole, others, pool.reps.size)
    assert counts.sum() == others.size
    hit = counts > 0
    assert all(first[p] == others[whole == p].min() for p in np.flatnonzero(hit))


def test_audits_are_non_representatives_per_prototype():
    m = rules.membership(100, ["education"], PROFILES)
    reps = rules.representatives(m, 0.1, 2, 3)
    audited = rules.audited(m, reps, 4, seed=3, round_=1)
    assert not (audited & reps).any()
    assert np.bincount(m.of[audited], minlength=3).tolist() == [4, 4, 4]
    assert (audited != rules.audited(m, reps, 4, seed=3, round_=2)).any()


def test_stand_ins_wrap_round_to_the_next_valid_answer():
    pool = rules.Pools(np.array([1, 5, 9, 2, 4]), np.array([0, 3, 5]))
    assert rules.stand_ins(pool, np.array([False, True, False, False, False])).tolist() == [1, 1, 1, -1, -1]


def test_w1_and_js_with_bootstrap_intervals():
    assert prototypes.w1(np.array([0.0, 10.0]), np.array([1.0, 1.0]), np.array([0.0, 10.0]), np.ones(2)) == 0
    assert prototypes.w1(np.array([0.0]), np.array([5.0]), np.array([3.0]), np.ones(1)) == pytest.approx(3.0)
    js, tv = prototypes.js_tv(np.array([1.0, 0.0]), np.array([0.0, 1.0]))
    assert js == pytest.approx(1.0) and tv == pytest.approx(1.0)
    value, lo, hi, tv = prototypes.divergence("numeric", [10, 20], [5, 5], [40] * 30, 100, seed=[1])
    assert value == pytest.approx(25.0) and lo <= value <= hi and tv is None
    value, lo, hi, tv = prototypes.divergence("categorical", ["a", "b"], [9, 1], ["a"] * 20, 100, seed=[1])
    assert 0 < value < 1 and tv == pytest.approx(0.1) and 0 <= lo <= hi
    # the same seed, the same interval
    assert prototypes.divergence("numeric", [1, 2], [1, 1], [1, 3, 4], 50, seed=[2]) == \
        prototypes.divergence("numeric", [1, 2], [1, 1], [1, 3, 4], 50, seed=[2])


@pytest.mark.parametrize(("patch", "message"), [
    ({"prototypes": {"share": 0}}, "prototypes.share: Input should be greater than 0"),
    ({"prototypes": {"share": 1.5}}, "prototypes.share: Input should be less than or equal to 1"),
    ({"prototypes": {"by": ["income"]}}, "prototypes.by: 'income' is not an attribute of agent 0's persona"),
    ({"prototypes": {"tolerance": -1}}, "prototypes.tolerance: Input should be greater than or equal to 0"),
    ({"prototypes": {"min_representatives": 500}},
     "prototypes.min_representatives: prototype 'education=Ph.D.' has 400 agent(s), fewer than the 500"),
    ({"population": {"changes": [{"after": "every", "left": 0.01}]}},
     "prototypes: a run whose population changes (population.changes) cannot have prototypes"),
])
def test_bad_prototypes_are_refused_before_the_run_naming_the_field(patch, message):
    from pathlib import Path

    import yaml

    from populace.client.prepare import parse_config, prepare
    from populace.core.scenario import ScenarioError

    root = Path(__file__).parents[2]
    scenario = yaml.safe_load((root / "examples" / "prototypes.yaml").read_text())
    scenario["population"]["config"] = str(root / "examples" / "population" / "education.yaml")
    for section, values in patch.items():
        scenario[section].update(values)
    with pytest.raises(ScenarioError) as err:
        prepare(parse_config(scenario))
    assert str(err.value).splitlines()[0].startswith(message)


def test_calls_per_round_counts_representatives_and_audits_per_prototype():
    # 400 agents at 4%: 16 representatives, 12 audits; 10 agents: the minimum 5, audits the 5 left
    assert rules.calls_per_round([400, 400, 10], 0.04, 5, 12) == (16 + 16 + 5, 12 + 12 + 5)
    assert rules.calls_per_round([3], 0.5, 5, 20) == (3, 0)


def test_the_report_shows_each_round_and_prototype_of_a_recorded_prototype_run(cli, tmp_path):
    import duckdb

    from populace.analysis.report.prototypes import prototype_section
    from populace.analysis.report.text import interval, number

    scenario = tmp_path / "p.yaml"
    scenario.write_text("simulation: ratio-game\nagents: 200\nrounds: 2\nseed: 4\n"
                        "prototypes: {share: 0.05, audits: 6}\nmodel: {backend: dummy, latency_s: 0}\n")
    db = tmp_path / "p.duckdb"
    r = cli("run", str(scenario), "--local", "--db", str(db), "--no-progress")
    assert r.returncode == 0, r.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        (run_id,) = con.execute("SELECT run_id FROM runs").fetchone()
        stats = con.execute("SELECT round, divergence, ci_low, ci_high FROM prototype_rounds ORDER BY round"
                            ).fetchall()
        section = prototype_section(con, run_id)
        assert prototype_section(con, "no-such-run") is None
    assert section is not None and section.anchor == "prototypes"
    note, table = section.blocks[0], section.blocks[1]
    # 10 of 200 agents call each round, 190 copy, 6 audited
    assert note.text.startswith("20 of 400 outcomes are the agents' own calls, 380 copied from their prototype's "
                                "representatives; 12 shadow audits; model calls 8.0% of the outcomes")
    assert [row[:8] for row in table.rows] == [[str(n), "all", "200", "0.0500", "10 (10 valid)", "190", "0", "6/6"]
                                              for n in (1, 2)]
    assert [(row[8], row[9]) for row in table.rows] == [(f"W1 {number(d, 3)}", interval(lo, hi))
                                                        for _, d, lo, hi in stats]


def test_an_environment_that_changes_who_is_alive_in_a_prototype_run_fails_the_round_naming_prototypes():
    import asyncio
    import sys
    from pathlib import Path

    from populace.core.contracts import RunConfig
    from populace.sdk import Changes
    from populace.sdk.engine import DecideFailed
    from populace.sdk.env import Env
    from populace.sdk.local import run_local
    from populace.sdk.registry import resolve

    sys.path.insert(0, str(Path(__file__).parents[1] / "e2e" / "sims"))
    from lifecycle_sims import TribeSummary, WanderEnv, Wanderers

    class LeavingEnv(WanderEnv):
        select = Env.select  # every agent acts, as a prototype run needs

        def decide(self, state, round, total):
            return state, TribeSummary(living=self.population.count), Changes(left=[0])

    class Leavers(Wanderers):
        name = "leavers"
        Env = LeavingEnv

    resolved = resolve(RunConfig.model_validate({"agents": 40, "rounds": 2, "prototypes": {"share": 0.1}}), Leavers)
    with pytest.raises(DecideFailed, match=r"^prototypes: simulation 'leavers' changed who is alive after round 1"):
        asyncio.run(run_local(resolved))
