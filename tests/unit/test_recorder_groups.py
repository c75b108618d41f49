"""What the recorder refuses of a scene's batch, group by group (populace.store.columns); how
its store keeps a refused group — the rest of the batch recorded, none of the group's outcomes,
acts and lines (none of them half), the group kept as missing unless its batch does not count (a
forged share: refused whole, adding nothing; a share replaced since, or rounds played again
after a resume: their refusals go with them); and when a finished run short of rows is
announced, and how (populace.store.shortfall)."""

from __future__ import annotations

import pytest

from populace.core.contracts import (
    ActColumns,
    Column,
    ConfigRef,
    EdgeColumns,
    LineColumns,
    OutcomeBatch,
    RoundResult,
    RunConfig,
    RunDone,
    RunResumed,
    RunStarted,
    SimulationTables,
    SpawnBatch,
)
from populace.store.columns import BadColumns, RefusedGroup, check_outcomes
from populace.store.shortfall import RoundTally, Verdict, verdict
from populace.store.store import Event, Store

TABLES = SimulationTables(simulation="talks", outcomes="talks_outcomes", outcome_columns=[Column(name="value",
                          type="BIGINT")], rounds="talks_rounds", summary_columns=[], grouped=True, acts="talks_acts",
                          act_columns=[Column(name="n", type="BIGINT")], edge_kinds=["follows"])


def batch(groups: dict[int, list[int]], acts: list[tuple[int, int]], lines: list[tuple[int, int]],
          act_values: list | None = None, edits: list[int] | None = None) -> OutcomeBatch:
    """Outcomes of `groups` (group -> its agents), acts as (group, agent), lines as (group, speaker)."""
    ids = [a for members in groups.values() for a in members]
    gids = [g for g, members in groups.items() for _ in members]
    n, k, m = len(ids), len(acts), len(lines)
    return OutcomeBatch(
        run_id="r1", round=2, host_id="host-1", seq=0, agent_ids=ids, columns={"value": [10 * a for a in ids]},
        valid=[True] * n, raws=[f"raw {a}" for a in ids], latency_ms=[1.0] * n, errors=[None] * n, group_ids=gids,
        acts=ActColumns(group_id=[g for g, _ in acts], seq=list(range(k)), agent_id=[a for _, a in acts],
                        phase=["speak"] * k, columns={"n": act_values or [1] * k}, valid=[True] * k,
                        raw=["said"] * k, latency_ms=[1.0] * k, error=[None] * k) if acts else None,
        lines=LineColumns(group_id=[g for g, _ in lines], seq=list(range(m)), speaker=[s for _, s in lines],
                          text=["hi"] * m, fields=[None] * m) if lines else None,
        edits=EdgeColumns(follower=edits, author=[0] * len(edits), kind=["follows"] * len(edits),
                          op=["add"] * len(edits)) if edits else None)


def test_a_whole_batch_is_recorded_as_it_came():
    b = batch({1: [0, 1], 2: [2, 3]}, acts=[(1, 0), (1, 1), (2, 3)], lines=[(1, 0), (1, -1), (2, 2)])
    kept, refused = check_outcomes(b, TABLES)
    assert refused == [] and kept.agent_ids == [0, 1, 2, 3] and kept.acts.agent_id == [0, 1, 3]


def test_a_bad_group_is_refused_alone_with_its_outcomes_acts_and_lines():
    b = batch({1: [0, 1], 2: [2, 3], 3: [4, 5], 4: [6, 7]},
              acts=[(1, 0), (2, 2), (2, 9), (3, 4), (4, 6), (4, 1), (5, 8)],
              lines=[(1, 0), (1, -1), (2, 3), (3, 5), (3, 2), (6, -1)], edits=[0, 2, 4])
    kept, refused = check_outcomes(b, TABLES)
    assert refused == [
        RefusedGroup(2, [2, 3], 2, 1, "acts.agent_id: agent 9 has no outcome in this batch"),
        RefusedGroup(3, [4, 5], 1, 2, "lines.speaker: agent 2 is in group 2, not group 3"),
        RefusedGroup(4, [6, 7], 2, 0, "acts.agent_id: agent 1 is in group 1, not group 4"),
        RefusedGroup(5, [], 1, 0, "acts.agent_id: agent 8 has no outcome in this batch"),
        RefusedGroup(6, [], 0, 1, "lines.group_id: group 6 has no member in this batch"),
    ]
    # group 1 is recorded whole; nothing of the others is half-recorded (their agents' edits go too)
    assert (kept.agent_ids, kept.group_ids, kept.columns["value"], kept.raws) == ([0, 1], [1, 1], [0, 10],
                                                                                  ["raw 0", "raw 1"])
    assert (kept.acts.group_id, kept.acts.agent_id, kept.acts.columns) == ([1], [0], {"n": [1]})
    assert (kept.lines.group_id, kept.lines.speaker) == ([1, 1], [0, -1])
    assert kept.edits.follower == [0]


def test_an_act_value_that_does_not_fit_its_column_refuses_its_group():
    b = batch({1: [0, 1], 2: [2, 3]}, acts=[(1, 0), (2, 2), (2, 3)], lines=[], act_values=[1, 2**70, 3])
    kept, refused = check_outcomes(b, TABLES)
    assert [(g.group_id, g.reason.split(":")[0]) for g in refused] == [(2, "acts.columns.n[1]")]
    assert kept.agent_ids == [0, 1] and kept.acts.columns == {"n": [1]}


def test_a_batch_without_agents_carries_no_acts_or_lines():
    kept, refused = check_outcomes(batch({}, acts=[(1, 0)], lines=[(1, -1)]), TABLES)
    assert kept.agent_ids == [] and kept.acts is None and kept.lines is None
    assert refused == [RefusedGroup(1, [], 1, 1, "acts.agent_id: agent 0 has no outcome in this batch")]


def test_a_group_none_of_the_batchs_agents_can_be_in_is_refused_with_what_it_carries():
    """Issue 41, attack 5: a host put its own agent in another host's group (groups of 2: agent 2
    is in group 1) and wrote the scene's lines (speaker -1) and acts there; the run's group
    layout now refuses the group, whatever the batch claims."""
    pairs = TABLES.model_copy(update={"group_sizes": [2]})
    b = batch({0: [0, 1], 7: [2]}, acts=[(0, 0), (7, 2)], lines=[(0, -1), (7, -1), (7, 2)])
    kept, refused = check_outcomes(b, pairs)
    assert refused == [RefusedGroup(7, [2], 1, 2, "group_ids: agent 2 cannot be in group 7 (groups of 2 consecutive "
                                                  "ids: its is 1)")]
    assert kept.agent_ids == [0, 1] and kept.lines.group_id == [0] and kept.acts.group_id == [0]
    assert check_outcomes(b, TABLES)[1] == []  # a run that declared no layout: as before
    # groups drawn again each round within blocks of 4 (two groups each): any of its block's
    blocks = TABLES.model_copy(update={"group_sizes": [2], "group_block": 4})
    assert check_outcomes(batch({1: [0, 3], 0: [2, 1], 2: [4, 6]}, acts=[], lines=[]), blocks)[1] == []
    _, refused = check_outcomes(batch({1: [0, 3], 2: [2, 1]}, acts=[], lines=[]), blocks)
    assert [(g.group_id, g.reason) for g in refused] == [
        (2, "group_ids: agent 2 cannot be in group 2 (groups are drawn within blocks of 4 agents: its block's are "
            "0..1)")]
    # nested groups: each outer level's id too
    firms = TABLES.model_copy(update={"group_sizes": [2, 4], "levels": ["firm"]})
    nested = batch({0: [0, 1], 2: [4, 5]}, acts=[], lines=[]).model_copy(update={"levels": {"firm": [0, 0, 1, 0]}})
    _, refused = check_outcomes(nested, firms)
    assert [(g.group_id, g.reason) for g in refused] == [(2, "levels.firm: agent 5 cannot be in firm 0 (its is 1)")]


def test_a_group_with_more_acts_or_lines_than_its_members_may_have_in_a_round_is_refused():
    """A host wrote 300 batches of forged lines (72 MB of DuckDB in 4.2 s): now a group of k members
    here carries at most 100 × k acts and 100 × k lines; each member's outcome is recorded once a
    round, so that bounds the group's round whatever the batches."""
    ok = batch({1: [0, 1]}, acts=[(1, 0)] * 200, lines=[(1, -1)] * 200)
    assert check_outcomes(ok, TABLES)[1] == []
    kept, refused = check_outcomes(batch({1: [0, 1], 2: [2]}, acts=[(1, 0)] * 201, lines=[(2, -1)] * 101), TABLES)
    assert [(g.group_id, g.acts, g.lines, g.reason) for g in refused] == [
        (1, 201, 0, "acts.group_id: group 1 has 201 acts in round 2, more than 100 per member (2 here)"),
        (2, 0, 101, "lines.group_id: group 2 has 101 lines in round 2, more than 100 per member (1 here)")]
    assert kept.agent_ids == [] and kept.acts is None and kept.lines is None


def test_what_is_wrong_with_the_whole_batch_still_refuses_it_whole():
    with pytest.raises(BadColumns, match=r"act columns \['m'\] are not the run's \['n'\]"):
        check_outcomes(batch({1: [0]}, acts=[(1, 0)], lines=[]).model_copy(update={"acts": ActColumns(
            group_id=[1], seq=[0], agent_id=[0], phase=["x"], columns={"m": [1]}, valid=[True], raw=["r"],
            latency_ms=[1.0], error=[None])}), TABLES)
    with pytest.raises(BadColumns, match="acts and lines belong to a simulation with scenes"):
        check_outcomes(batch({1: [0]}, acts=[(1, 0)], lines=[]), TABLES.model_copy(update={"acts": None}))


# -- when a finished run is announced, and what it lacks ------------------------------------------
def test_a_run_whose_every_outcome_is_in_lacks_nothing():
    assert verdict([RoundTally(1, 4000, 4000), RoundTally(2, 4000, 4000)], quiet_s=0, wait_s=180) == Verdict(False)


def test_refused_groups_are_known_missing_at_once_and_said_per_round():
    first = "group 17 of host-1@0 refused: acts.agent_id: agent 9 has no outcome in this batch"
    v = verdict([RoundTally(1, 4000, 4000), RoundTally(2, 4000, 3976, refused=24, acts=70, lines=82, groups=12,
                                                        first=first)], quiet_s=0, wait_s=180)
    assert not v.wait
    assert v.reason == (f"round 2: 24 of 4,000 outcomes, 70 acts and 82 lines missing (12 groups refused, the first "
                        f"{first})")
    assert (v.outcomes_missing, v.acts_missing, v.lines_missing, v.refused_groups) == (24, 70, 82, 12)
    one = verdict([RoundTally(3, 10, 10, acts=1, groups=1, first="group 5 of h@0 refused: x")], 0, 180)
    assert one.reason == "round 3: 1 act missing (group 5 of h@0 refused: x)"  # outcomes in, an act is not


def test_outcomes_neither_in_nor_refused_are_waited_for_while_outcomes_come_then_missing():
    rounds = [RoundTally(1, 4000, 4000), RoundTally(2, 4000, 3500)]
    assert verdict(rounds, quiet_s=179, wait_s=180).wait
    v = verdict(rounds, quiet_s=180, wait_s=180)
    assert not v.wait and v.reason == "round 2: 500 of 4,000 outcomes missing (500 never arrived: none came in 180s)"
    assert (v.outcomes_missing, v.unexplained) == (500, 500)


def test_a_round_without_a_result_is_waited_for_then_said():
    rounds = [RoundTally(1, 100, 100), RoundTally(2, None, 40), RoundTally(3, None, 0), RoundTally(5, None, 0)]
    assert verdict(rounds, quiet_s=10, wait_s=180).wait
    assert verdict(rounds, quiet_s=200, wait_s=180).reason == "rounds 2-3, 5: no result recorded (none came in 180s)"


# -- the store -------------------------------------------------------------------------------------
CFG = RunConfig(agents=8, rounds=2)


def outcomes(msg_id: str, b) -> Event:
    kept, refused = check_outcomes(b, TABLES)
    return Event(msg_id, "outcomes", kept, refused_groups=refused)


def on(b, host: str, round_: int, epoch: int = 0):
    return b.model_copy(update={"host_id": host, "round": round_, "epoch": epoch})


def result(round_: int, n: int = 8) -> Event:
    return Event(f"result.{round_}", "round.result", RoundResult(run_id="r1", round=round_, n=n, n_valid=n, summary={},
                                                                  observation={}, closed_at=1e9))


def start(store: Store) -> None:
    store.ingest([
        Event("started", "started", RunStarted(run_id="r1", config=CFG, started_at=1e9, hosts=["a", "b"],
                                               tables=TABLES)),
        Event("spawn-a", "spawn", SpawnBatch(run_id="r1", host_id="a", ranges=[(0, 4)], config_ref=ConfigRef.of(CFG))),
        Event("spawn-b", "spawn", SpawnBatch(run_id="r1", host_id="b", ranges=[(4, 4)], config_ref=ConfigRef.of(CFG))),
    ])


def whole(host: str, first: int):
    return batch({first // 2: [first, first + 1], first // 2 + 1: [first + 2, first + 3]},
                 acts=[(first // 2, first), (first // 2 + 1, first + 3)], lines=[(first // 2, -1)])


def with_bad_group(host: str, first: int):  # the second group's act is by an agent not in the batch
    return batch({first // 2: [first, first + 1], first // 2 + 1: [first + 2, first + 3]},
                 acts=[(first // 2, first), (first // 2 + 1, 7 - first)], lines=[(first // 2 + 1, first + 2)])


def count(store: Store, sql: str) -> int:
    return store.con.execute(sql).fetchone()[0]


def test_the_rest_of_the_batch_is_recorded_and_the_group_counted_missing(tmp_path):
    store = Store(tmp_path / "x.duckdb")
    start(store)
    out = store.ingest([outcomes("a.1", on(whole("a", 0), "a", 1)), outcomes("b.1", on(whole("b", 4), "b", 1)),
                        result(1), outcomes("a.2", on(with_bad_group("a", 0), "a", 2)),
                        outcomes("b.2", on(whole("b", 4), "b", 2)), result(2),
                        Event("done", "done", RunDone(run_id="r1", status="completed", rounds=2, finished_at=2e9))])
    assert out.outcomes == 14 and out.refused == []
    assert [(rid, r, share, g.group_id, g.agents) for rid, r, share, g in out.refused_groups] == \
        [("r1", 2, "a@0", 1, [2, 3])]
    assert count(store, "SELECT count(*) FROM talks_outcomes WHERE round = 2 AND agent_id IN (2, 3)") == 0
    assert count(store, "SELECT count(*) FROM talks_acts WHERE round = 2 AND group_id = 1") == 0
    assert count(store, "SELECT count(*) FROM transcripts WHERE round = 2 AND group_id = 1") == 0
    assert count(store, "SELECT count(*) FROM talks_acts WHERE round = 2 AND group_id = 0") == 1  # the rest: in
    assert store.completeness("r1", 2) == (14, 16)
    tallies = store.tallies("r1", 2)
    assert tallies == [RoundTally(1, 8, 8), RoundTally(2, 8, 6, refused=2, acts=1, lines=1, groups=1,
                                                       first="group 1 of a@0 refused: acts.agent_id: agent 7 has no "
                                                             "outcome in this batch")]
    v = verdict(tallies, quiet_s=0, wait_s=180)  # known missing: no wait
    assert not v.wait and v.reason.startswith("round 2: 2 of 8 outcomes, 1 act and 1 line missing (group 1 of a@0")
    store.close()


def test_a_forged_batch_adds_nothing_and_marks_nothing_missing(tmp_path):
    store = Store(tmp_path / "x.duckdb")
    start(store)
    out = store.ingest([outcomes("z.1", on(with_bad_group("z", 0), "z", 1)),  # a share never placed
                        outcomes("b.1", on(with_bad_group("b", 0), "b", 1))])  # b's subject, a's agents
    assert [why for _, why in out.refused] == ["share z@0 was never placed in run r1",
                                               "agent 0 is not one of share b@0's agents"]
    assert out.refused_groups == [] and not store.has_refused_groups("r1")
    assert count(store, "SELECT count(*) FROM talks_outcomes") == 0
    store.close()


def test_a_replaced_share_and_a_resume_take_their_refusals_with_them(tmp_path):
    store = Store(tmp_path / "x.duckdb")
    start(store)
    store.ingest([outcomes("a.1", on(with_bad_group("a", 0), "a", 1)), outcomes("b.1", on(whole("b", 4), "b", 1)),
                  result(1), outcomes("a.2", on(with_bad_group("a", 0), "a", 2))])
    assert [t.refused for t in store.tallies("r1", 2)] == [2, 2]
    # host a lost in round 2: its agents placed again from round 2, which they play again
    store.ingest([Event("spawn-c", "spawn", SpawnBatch(run_id="r1", host_id="c", ranges=[(0, 4)], from_round=2,
                                                       epoch=1, config_ref=ConfigRef.of(CFG))),
                  outcomes("c.2", on(whole("c", 0), "c", 2, epoch=1)), outcomes("b.2", on(whole("b", 4), "b", 2)), result(2)])
    assert [(t.got, t.refused) for t in store.tallies("r1", 2)] == [(6, 2), (8, 0)]  # round 1 was a's, and counts
    store.ingest([Event("resumed", "resumed", RunResumed(run_id="r1", epoch=1, after_round=0, hosts=["c"],
                                                         resumed_at=3e9))])
    assert not store.has_refused_groups("r1")
    store.close()


def test_a_group_refused_from_a_forgers_batch_and_then_sent_whole_by_its_host_is_not_missing(tmp_path):
    store = Store(tmp_path / "x.duckdb")
    start(store)
    store.ingest([outcomes("forged.1", on(with_bad_group("a", 0), "a", 1)),  # first: group 1 refused
                  outcomes("a.1", on(batch({1: [2, 3]}, acts=[(1, 3)], lines=[]), "a", 1)),  # the host's own
                  outcomes("b.1", on(whole("b", 4), "b", 1)), result(1)])
    assert store.has_refused_groups("r1") and store.completeness("r1", 1) == (8, 8)
    assert verdict(store.tallies("r1", 1), quiet_s=0, wait_s=180) == Verdict(False)
    store.close()


def test_a_runs_tables_carry_its_group_layout_for_the_recorder_to_check():
    from populace.sdk.registry import resolve

    pairs = resolve(RunConfig(simulation="ultimatum", agents=40, rounds=1)).tables()
    assert (pairs.group_sizes, pairs.group_block) == ([2], 100)  # pairs drawn again each round in blocks
    fives = resolve(RunConfig(simulation="public-goods", agents=40, rounds=1)).tables()
    assert (fives.group_sizes, fives.group_block) == ([5], None)
    plain = resolve(RunConfig(simulation="ratio-game", agents=40, rounds=1)).tables()
    assert (plain.group_sizes, plain.group_block) == ([], None)


def test_an_ungrouped_runs_tallies_need_no_group_column(tmp_path):
    """A simulation without groups has no group_id column: counting what is missing at a run's end
    (after a recorder restart, say) must not refer to one (DuckDB refused the whole query)."""
    flat = TABLES.model_copy(update={"simulation": "flat", "outcomes": "flat_outcomes", "rounds": "flat_rounds",
                                     "grouped": False, "acts": None, "act_columns": [], "edge_kinds": []})
    store = Store(tmp_path / "x.duckdb")
    store.ingest([Event("started", "started", RunStarted(run_id="r1", config=CFG, started_at=1e9, hosts=["a"],
                                                         tables=flat)),
                  Event("spawn-a", "spawn", SpawnBatch(run_id="r1", host_id="a", ranges=[(0, 8)],
                                                       config_ref=ConfigRef.of(CFG)))])
    ids = list(range(8))
    store.ingest([Event("a.1", "outcomes", OutcomeBatch(
        run_id="r1", round=1, host_id="a", seq=0, agent_ids=ids, columns={"value": ids}, valid=[True] * 8,
        raws=["x"] * 8, latency_ms=[1.0] * 8, errors=[None] * 8)), result(1)])
    assert store.tallies("r1", 1) == [RoundTally(1, 8, 8)]
    store.close()


def test_the_store_folds_its_write_ahead_log_at_its_own_threshold_not_duckdbs_default(tmp_path):
    import duckdb

    from populace.store.store import CHECKPOINT_THRESHOLD

    expected = duckdb.connect()
    expected.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
    store = Store(tmp_path / "x.duckdb")
    try:
        got = store.con.execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0]
        assert got == expected.execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0]
        assert got != duckdb.connect().execute("SELECT current_setting('checkpoint_threshold')").fetchone()[0]
    finally:
        store.close()
        expected.close()
