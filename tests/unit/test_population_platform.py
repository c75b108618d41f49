"""Populations that change, the platform's pure parts (issue 37): the orchestrator places a
round's newcomers before the next round opens and announces who is alive; a restore, a resume
and a fork read the checkpoint of the agents that played the round and who was alive after it;
a host lets the departed go and makes the newcomers placed on it; a range's checkpoint chain may
grow; the recorder refuses an outcome of a departed agent and owes interview answers only of
those who played; a post-hoc interview expects only them."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from populace.core.checkpoints import resolve_chain
from populace.core.contracts import InterviewRequest, LivingRef, OutcomeBatch, RoundResult, RunConfig
from populace.core.interviews import expected as owed_answers
from populace.orchestrator import interviews
from populace.orchestrator.workflow import (
    OpenRound,
    fork_run,
    layout_for,
    new_run,
    on_result,
    on_spawned,
    restore_point,
    round_open,
    state_ref,
)
from populace.population.living import GONE, Changes, Population
from populace.sdk.hosting import host_run
from populace.sdk.registry import resolve
from populace.store.expected import RunShape, outcome_refusal

CONFIG = RunConfig(agents=1000, rounds=5)
REF = {"name": "r1.2.population", "digest": "a" * 64}


def result(round_: int, living: LivingRef | None = None) -> RoundResult:
    return RoundResult(run_id="r1", round=round_, n=10, n_valid=10, summary={}, observation={},
                       closed_at=1.0, shares=["h1@0", "h2@0"], population=living,
                       env_checkpoint=format(round_, "064x"))


def running():
    s = new_run("r1", CONFIG, {"h1": [(0, 600)], "h2": [(600, 400)]})
    s, _ = on_spawned(s, "h1")
    s, _ = on_spawned(s, "h2")
    return s


def test_a_round_s_newcomers_are_placed_before_the_next_round_opens_and_it_names_who_is_alive():
    s = running()
    assert round_open(s, OpenRound(1, 1000), 0.0).ranges == {}  # nobody came or went: as before
    living = LivingRef(**REF, round=1, size=1040, first=1000, living=1020)
    s, acts = on_result(s, result(1, living))
    assert acts == [OpenRound(2, 1000)] and s.population == living
    assert s.placement == {"h1": [(0, 600)], "h2": [(600, 440)]}  # the share holding fewer took them
    opened = round_open(s, OpenRound(2, 1000), 0.0)
    assert opened.population == living and opened.shares == {"h1@0": 600, "h2@0": 440}
    assert opened.ranges == {"h1@0": [(0, 600)], "h2@0": [(600, 440)]}
    # round 2 changes nobody: the population stays the one after round 1, nothing is placed
    s2, _ = on_result(s, result(2, living))
    assert s2.placement == s.placement and s2.population == living
    # a restore after round 1 reads the checkpoint of the agents that played it (the first 1000)
    # and who is alive after it (its newcomers take the state they were born with)
    r = restore_point(on_result(s, result(2, living))[0].model_copy(update={"round": 2, "status": "paused"}))
    assert r.round == 2 and r.population == living and r.ranges == [(0, 600), (600, 440)]
    r1 = restore_point(s.model_copy(update={"status": "paused", "round": 1}))
    assert r1.round == 1 and r1.ranges == [(0, 600), (600, 400)]
    assert layout_for(s, 1, living.size_in(1)) == [(0, 600), (600, 400)] and living.size_in(2) == 1040


def test_a_fork_places_every_id_its_parent_gave_and_restores_who_was_alive():
    parent = running()
    living = LivingRef(**REF, round=1, size=1040, first=1000, living=1020)
    parent, _ = on_result(parent, result(1, living))
    f = fork_run("f1", CONFIG, {"h9": [(0, 1040)]}, parent, 1, state_ref("r1", 1, "e" * 64), {},
                 population=living)
    assert f.population == living and f.restore.population == living
    assert f.restore.ranges == [(0, 600), (600, 400)]  # what its parent checkpointed in round 1


def test_a_host_lets_the_departed_go_and_makes_the_newcomers_placed_on_it():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "e2e" / "sims"))
    from lifecycle_sims import Wanderers

    resolved = resolve(RunConfig.model_validate({"agents": 10, "rounds": 3}), Wanderers)
    run = host_run(resolved, "r", [(5, 5)], freeze=False)
    run.take_changed()  # a checkpoint took them all
    p = Population.start(10).after(Changes(died=[2, 6], arrived=3), 1)
    run.apply(p, [(5, 5), (10, 2)])
    assert run.ranges == [(5, 7)] and run.count == 6 and run.agents[1] is None
    assert run.ids.tolist() == list(range(5, 12)) and run.living.tolist() == [1, 0, 1, 1, 1, 1, 1]
    assert run.positions(np.array([6, 11, 12, 2])).tolist() == [1, 6, -1, -1]
    assert run.take_changed() == {1, 5, 6}  # the departed (gone in the next checkpoint), the newcomers
    run.apply(p, [(5, 5), (10, 2)])  # the same population again: nothing changes
    assert run.count == 6
    part, = asyncio.run(run.snapshot())
    assert (part.first, part.count, part.full, part.rows, part.marks) == (5, 7, True, [0, 2, 3, 4], {"gone": [1],
                                                                                                  "fresh": [5, 6]})
    assert resolve_chain([part.value()], 5, 7)[GONE] == [None, True, None, None, None, None, None]
    assert run.engine.selected(2, None, None) == [0, 2, 3, 4, 5, 6]  # the departed never act
    assert run.unmade == 0 and all(a is not None for a in (run.agents[5], run.agents[6]))  # made now they act
    # changes of two rounds at once (never in sequence): whoever is no longer alive goes
    later = host_run(resolve(RunConfig.model_validate({"agents": 10, "rounds": 3}), Wanderers), "r", [(5, 5)],
                     freeze=False)
    p2 = p.after(Changes(left=[9]), 2)
    assert p2.delta.prior == 1
    later.apply(p2, [(5, 5)])
    assert later.living.tolist() == [1, 0, 1, 1, 0] and later.count == 3


def test_a_range_s_checkpoint_chain_may_grow_by_newcomers():
    base = {"first": 10, "count": 2, "fields": {"memory": [["a"], ["b"]]}}
    grown = {"first": 10, "count": 4, "changed": [1, 2, 3],
             "fields": {"memory": [None, [], ["c"]], GONE: [True, None, None]}}
    assert resolve_chain([grown, base], 10, 4) == {"memory": [["a"], None, [], ["c"]], GONE: [None, True, None, None]}


def test_the_departed_and_unmade_newcomers_are_stored_as_offsets_not_rows():
    from populace.core.checkpoint_rows import FRESH
    from populace.core.checkpoints import compacted

    full = {"memory": [["a"], None, ["c"], None], GONE: [None, True, None, None], FRESH: [None, None, None, True]}
    rows, held, marks = compacted(dict(full), 4, None)
    assert rows == {"memory": [["a"], ["c"]]} and held == [0, 2] and marks == {"gone": [1], "fresh": [3]}
    base = {"first": 0, "count": 4, "fields": rows, "held": held, **marks}
    delta_rows, changed, delta_marks = compacted({"memory": [["d"], None], GONE: [None, True]}, 6, [3, 4])
    assert changed == [3] and delta_marks == {"gone": [4]}
    delta = {"first": 0, "count": 6, "fields": delta_rows, "changed": changed, **delta_marks}
    assert resolve_chain([base], 0, 4) == full
    assert resolve_chain([delta, base], 0, 6) == {"memory": [["a"], None, ["c"], ["d"], None, None],
                                                  GONE: [None, True, None, None, True, None],
                                                  FRESH: [None, None, None, None, None, None]}
    plain = {"memory": [["a"], ["b"]]}
    assert compacted(plain, 2, None) == (plain, None, {})
    # stored as runs when they come in runs (a range of newcomers none of which acted)
    from populace.core.checkpoints import as_runs, offsets_of

    assert as_runs(list(range(10, 1000))) == {"runs": [[10, 990]]} and as_runs([1, 5, 9]) == [1, 5, 9]
    assert offsets_of(as_runs(list(range(10, 1000)))) == list(range(10, 1000))
    runs = {"first": 0, "count": 6, "fields": {"memory": [["a"]]}, "held": [0], "fresh": {"runs": [[1, 5]]}}
    assert resolve_chain([runs], 0, 6)[FRESH] == [None, True, True, True, True, True]


def test_the_recorder_refuses_an_outcome_of_an_agent_that_departed_before_its_round():
    def batch(round_: int, ids: list[int]) -> OutcomeBatch:
        n = len(ids)
        return OutcomeBatch(run_id="r1", round=round_, host_id="h1", seq=0, agent_ids=ids, columns={},
                            valid=[True] * n, raws=[""] * n, latency_ms=[0.0] * n, errors=[None] * n)

    departed = np.zeros(12, dtype=np.int32)
    departed[3] = 2  # departed after round 2
    shape, seen = RunShape(12, 5), np.zeros(12, dtype=bool)
    assert outcome_refusal(batch(2, [3]), [(0, 12)], 1, shape, seen, departed=departed) is None
    assert outcome_refusal(batch(3, [1, 3]), [(0, 12)], 1, shape, seen, departed=departed) == \
        "agent 3 departed after round 2: it has no outcome in round 3"
    assert outcome_refusal(batch(3, [12]), [(0, 20)], 1, shape, seen, departed=departed) == \
        "agent 12 is not in run r1 (12 agent ids so far)"


def test_answers_are_owed_and_expected_only_of_those_who_played_the_round():
    c = RunConfig.model_validate({"agents": 10, "rounds": 3, "interviews": [{
        "id": "q", "after": "every", "questions": [{"id": "a", "kind": "text", "text": "?", "max_chars": 10}]}]})
    played = {1: np.arange(10), 2: np.arange(8), 3: np.arange(12)}
    assert owed_answers(c.interviews, 10, 0, 3) == 30
    assert owed_answers(c.interviews, 10, 0, 3, played=lambda r: played[r]) == 30
    assert owed_answers(c.interviews, 10, 0, 2, played=lambda r: played[r]) == 18
    mask = np.zeros(12, dtype=bool)
    mask[[0, 1, 2, 11]] = True
    req = InterviewRequest(run_id="r1", request="x", after_round=2, survey=c.interviews[0].survey)
    assert interviews.expected(req, 10, 0, mask) == 4
    named = req.model_copy(update={"agents": [1, 5]})
    assert interviews.absent(named, mask) == ("agents: agent 5 did not play round 2 (it departed before it, or "
                                              "came after it): it cannot be asked after it")
    assert interviews.absent(req, mask) is None


@pytest.mark.parametrize(("round_", "ids"), [(2, 1000), (3, 1040), (4, 1040)])
def test_a_living_ref_says_how_many_ids_a_round_was_played_with(round_, ids):
    ref = LivingRef(**REF, round=2, size=1040, first=1000, living=990)
    assert ref.size_in(round_) == ids  # its own round: before its newcomers
