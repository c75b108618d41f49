"""The recorder's table `interviews`: each (run, round, survey, question, agent) once, from the
share that holds the agent, for the agents and surveys the run plans, with valid answers its
questions allow; a resume drops the answers of the rounds it plays again; what a run owes."""

from __future__ import annotations

import duckdb
from populace_ratio_game import RatioGame

from populace.core.contracts import (
    ConfigRef,
    InterviewBatch,
    InterviewOrder,
    LlmCallBatch,
    PlannedInterview,
    Question,
    Restore,
    RunConfig,
    RunResumed,
    RunStarted,
    SpawnBatch,
    Usage,
)
from populace.core.interviews import respondents
from populace.store.interviews import Owed
from populace.store.store import Event, Store

CAR = Question(id="car", text="A car?", options=["yes", "no"])
TRUST = Question(id="trust", text="Trust?", points=5)
PANEL = PlannedInterview(id="panel", after="every", questions=[CAR, TRUST])
HALF = PlannedInterview(id="half", after=[2], sample=0.5, questions=[CAR])
CONFIG = RunConfig(agents=20, rounds=3, seed=5, interviews=[PANEL, HALF])
SEQ = iter(range(10**6))


def start(store: Store, run_id: str = "r1") -> None:
    store.ingest([
        Event(f"{run_id}.started", "started", RunStarted(run_id=run_id, config=CONFIG, started_at=1e9,
                                                         hosts=["a", "b"], tables=RatioGame.tables())),
        Event(f"{run_id}.spawn-a", "spawn", SpawnBatch(run_id=run_id, host_id="a", ranges=[(0, 10)], config_ref=ConfigRef.of(CONFIG))),
        Event(f"{run_id}.spawn-b", "spawn", SpawnBatch(run_id=run_id, host_id="b", ranges=[(10, 10)], config_ref=ConfigRef.of(CONFIG))),
    ])


def answers(ids, host="a", round_=1, plan=PANEL, epoch=0, answer="yes", value=None, usage=None, request=None,
            valid=True) -> InterviewBatch:
    rows = [(a, q.id) for a in ids for q in plan.questions]
    return InterviewBatch(
        run_id="r1", after_round=round_, host_id=host, epoch=epoch, seq=next(SEQ), survey=plan.survey,
        request=request, agent_ids=[a for a, _ in rows], questions=[q for _, q in rows],
        answers=[answer if q == "car" else "3" for _, q in rows],
        values=[value if q == "car" else 3.0 for _, q in rows], raws=["{}"] * len(rows), valid=[valid] * len(rows),
        errors=[None if valid else "no"] * len(rows), latency_ms=[1.0] * len(rows), usage=usage or Usage())


def ingest(store: Store, *batches: InterviewBatch):
    return store.ingest([Event(f"iv.{next(SEQ)}", "interviews", b) for b in batches])


def count(store: Store, where: str = "TRUE") -> int:
    return store.con.execute(f"SELECT count(*) FROM interviews WHERE {where}").fetchone()[0]


def test_answers_are_stored_once_each_from_the_share_that_holds_the_agents(tmp_path):
    store = Store(tmp_path / "x.duckdb")
    start(store)
    out = ingest(store, answers(range(10), usage=Usage(llm_calls=20, prompt_tokens=900)),
                 answers(range(10, 20), host="b"))
    assert out.answers == 40 and not out.refused
    # a replacement asks again (another epoch) and a redelivery comes twice: the first answers stay
    store.ingest([Event("r1.spawn-c", "spawn", SpawnBatch(run_id="r1", host_id="c", epoch=1, ranges=[(0, 10)],
                                                          config_ref=ConfigRef.of(CONFIG), from_round=2))])
    again = ingest(store, answers(range(10), host="c", epoch=1, answer="no"))
    assert again.answers == 0 and not again.refused
    assert count(store, "answer = 'no'") == 0 and count(store) == 40
    assert store.interviews_owed("r1", 1) == Owed(answers=40, owed=40, pending=0)
    half = respondents(20, seed=5, survey_id="half", sample=0.5).size
    assert store.interviews_owed("r1", 3) == Owed(answers=40, owed=3 * 40 + half, pending=2 * 40 + half)
    assert store.con.execute("SELECT sum(llm_calls), sum(prompt_tokens) FROM interview_usage").fetchone() == (20, 900)
    asked = store.con.execute("SELECT position, question, kind FROM interview_questions WHERE position >= 0 "
                              "ORDER BY position").fetchall()
    assert asked == [(0, "car", "options"), (1, "trust", "likert")]
    store.close()
    with duckdb.connect(str(tmp_path / "x.duckdb"), read_only=True) as con:
        cols = [r[0] for r in con.execute("DESCRIBE interviews").fetchall()]
    assert cols == ["run_id", "after_round", "survey", "question", "agent_id", "answer", "value", "raw", "valid",
                    "error", "latency_ms", "request", "host_id"]


def test_what_the_run_did_not_plan_is_refused(tmp_path):
    store = Store(tmp_path / "x.duckdb")
    start(store)
    chosen = respondents(20, seed=5, survey_id="half", sample=0.5).tolist()
    left = [a for a in range(10) if a not in chosen]
    other = PlannedInterview(id="panel", after="every", questions=[CAR])  # the planned id, other questions
    cases = {
        "agent 12 is not one of a's agents": answers([3, 12]),
        "share z@0 was never placed": answers([1], host="z"),
        "is not planned after round 1": answers([1], plan=HALF),
        "survey 'half' does not choose every agent": answers([left[0]], plan=HALF, round_=2),
        "is not one the run plans": answers([1], plan=other),
        "valid, but 'maybe' is not one of the options": answers([1], answer="maybe"),
        "round 4: run r1 has 3 rounds": answers([1], round_=4),
        "request 'q1' was never placed on a": answers([1], request="q1"),
    }
    out = ingest(store, *cases.values())
    assert out.answers == 0 and len(out.refused) == len(cases)
    for (_, why), says in zip(out.refused, cases):
        assert says in why, (why, says)
    assert ingest(store, answers([1], answer="maybe", valid=False)).answers == 2  # invalid, with its raw text
    assert ingest(store, answers([c for c in chosen if c < 10], plan=HALF, round_=2)).answers > 0


def test_a_resume_drops_the_planned_answers_of_the_rounds_played_again(tmp_path):
    store = Store(tmp_path / "x.duckdb")
    start(store)
    ingest(store, answers(range(10), round_=1), answers(range(10), round_=2), answers(range(10), round_=3))
    store.ingest([Event("r1.resumed", "resumed", RunResumed(run_id="r1", epoch=1, after_round=1, hosts=["a"],
                                                            resumed_at=1e9)),
                  Event("r1.spawn-a1", "spawn", SpawnBatch(run_id="r1", host_id="a", epoch=1, ranges=[(0, 20)],
                                                           config_ref=ConfigRef.of(CONFIG), from_round=2))])
    assert store.con.execute("SELECT DISTINCT after_round FROM interviews").fetchall() == [(1,)]
    stale = ingest(store, answers(range(10), round_=2))  # the replaced share's, of a round played again
    assert stale.answers == 0 and "share a@0 did not play round 2 (or was replaced before it)" in stale.refused[0][1]
    assert ingest(store, answers(range(10), round_=2, epoch=1)).answers == 20  # asked again as round 2 is played again
    # the new share asks round 1's again from its checkpoint: those stay as first answered
    assert ingest(store, answers(range(10), round_=1, epoch=1, answer="no")).answers == 0


def test_a_fork_owes_the_answers_of_its_own_rounds_and_a_resume_awaits_only_what_it_asks_again(tmp_path):
    """A fork after round 1 (its shares play from round 2) owes no answer after round 1: its
    parent gave them. A resume after round 2 asks rounds 2 and 3 (its shares ask round 2's again
    from its checkpoint), never round 1's: round 1's missing answers are missing at once, not
    awaited."""
    store = Store(tmp_path / "x.duckdb")
    half = respondents(20, seed=5, survey_id="half", sample=0.5)
    store.ingest([
        Event("f1.started", "started", RunStarted(run_id="f1", config=CONFIG, started_at=1e9, hosts=["a"],
                                                  tables=RatioGame.tables())),
        Event("f1.spawn-a", "spawn", SpawnBatch(run_id="f1", host_id="a", ranges=[(0, 20)], from_round=2,
                                                config_ref=ConfigRef.of(CONFIG, 2)))])
    rows = [answers(range(20), round_=n) for n in (2, 3)]
    for b in rows:
        b.run_id = "f1"
    assert store.interviews_owed("f1", 3) == Owed(answers=0, owed=2 * 40 + half.size, pending=2 * 40 + half.size)
    assert ingest(store, *rows).answers == 2 * 40
    got = store.interviews_owed("f1", 3)
    assert got == Owed(answers=80, owed=80 + half.size, pending=half.size) and got.missing == half.size

    start(store)  # r1: round 1's answers of agents 0..9 came, 10..19's were cut short by a pause
    ingest(store, answers(range(10), round_=1))
    store.ingest([Event("r1.resumed", "resumed", RunResumed(run_id="r1", epoch=1, after_round=2, hosts=["a"],
                                                            resumed_at=1e9)),
                  Event("r1.spawn-a1", "spawn", SpawnBatch(run_id="r1", host_id="a", epoch=1, ranges=[(0, 20)],
                                                           config_ref=ConfigRef.of(CONFIG), from_round=3))])
    ingest(store, answers(range(20), round_=2, epoch=1), answers(range(20), round_=3, epoch=1))
    owed = store.interviews_owed("r1", 3)
    assert owed == Owed(answers=20 + 40 + 40, owed=3 * 40 + half.size, pending=half.size)
    assert owed.missing == 20 + half.size  # round 1's 10 agents × 2 questions, and `half` after round 2


def test_a_local_runs_planned_interviews_are_recorded_as_a_fleet_runs(tmp_path):
    """`simulate(local=True)` records the run through the recorder's store: its planned answers
    and their LLM calls go in too (table interviews, interview_usage), every answer once, and
    the result's `interviews` is what was recorded."""
    from populace.analysis.interviews import interview_usage
    from populace.client import simulate

    plans = [p.model_dump(mode="json", exclude_unset=True) for p in (PANEL, HALF)]
    result = simulate({"simulation": "ratio-game", "agents": 20, "rounds": 3, "seed": 5, "interviews": plans,
                       "model": {"backend": "dummy", "latency_s": 0.0}}, local=True, db=str(tmp_path / "p.duckdb"))
    assert result.status == "completed", result.reason
    keys = ("after_round", "survey", "question", "agent_id", "answer", "value", "raw", "valid", "error")
    with duckdb.connect(result.db_path, read_only=True) as con:
        got = con.execute(f"SELECT {', '.join(keys)} FROM interviews WHERE run_id = ? AND request IS NULL "
                          "ORDER BY after_round, survey, agent_id, question", [result.run_id]).fetchall()
        usage = interview_usage(con, result.run_id)
    played = result.local.interviews
    assert got == sorted(zip(*(played[k] for k in keys)), key=lambda r: (r[0], r[1], r[3], r[2]))
    assert len(got) == 3 * 20 * 2 + len(respondents(20, seed=5, survey_id="half", sample=0.5)) == result.interviews.num_rows
    assert usage["answers"] == len(got) and usage["llm_calls"] == result.local.interview_calls >= len(got)


def calls(requester: str, ids: list[int], round_: int = 1) -> LlmCallBatch:
    n = len(ids)
    return LlmCallBatch(run_id="r1", round=round_, batch_id=f"b{next(SEQ)}", agent_ids=ids, replicas=["x"] * n,
                        prompt_tokens=[1] * n, completion_tokens=[1] * n, latency_ms=[1.0] * n, attempts=[1] * n,
                        valid=[True] * n, requester=requester)


def test_a_host_ordered_to_interview_may_record_the_calls_of_the_agents_it_was_ordered_to_ask(tmp_path):
    """A post-hoc interview may be placed on a fleet member that holds no share of the run (its
    own NATS user, `populace auth host`): its call records for the agents it was ordered to ask
    are recorded, not dead-lettered; for any other agent they still are."""
    store = Store(tmp_path / "x.duckdb")
    start(store)
    order = InterviewOrder(run_id="r1", host_id="c", request="iv-1", after_round=1, survey=PANEL.survey,
                           ranges=[(0, 5)], restore=Restore(run_id="r1", round=1, ranges=[(0, 10), (10, 10)]),
                           config_ref=ConfigRef.of(CONFIG))
    out = store.ingest([Event("r1.order-c", "interview.order", order),
                        Event("r1.calls-1", "calls", calls("c", [0, 1, 2, 3, 4])),
                        Event("r1.calls-2", "calls", calls("c", [12]))])
    assert [msg_id for msg_id, _ in out.refused] == ["r1.calls-2"]
    assert out.calls == 5
    assert store.con.execute("SELECT count(*) FROM llm_calls WHERE run_id = 'r1'").fetchone()[0] == 5


def test_a_lost_hosts_part_ordered_again_completes_the_request_with_each_answer_once(tmp_path):
    """iv-1 placed on a and b (40 answers); b is lost after its first answers, its ranges are
    ordered from a (placement 1): a's answers for them count, b's stay, the duplicates go, and
    the request is complete once. iv-2 fails (InterviewPlaced.error): never announced."""
    from populace.core.contracts import InterviewPlaced

    store = Store(tmp_path / "x.duckdb")
    start(store)
    restore = Restore(run_id="r1", round=1, ranges=[(0, 10), (10, 10)])

    def order(host, ranges, request="iv-1", placement=0):
        return Event(f"r1.ask.{request}.{host}.{placement}", "ask", InterviewOrder(
            run_id="r1", host_id=host, request=request, after_round=1, survey=PANEL.survey, ranges=ranges,
            restore=restore, config_ref=ConfigRef.of(CONFIG), placement=placement))

    def placed(request="iv-1", error=None, placement=0):
        return Event(f"r1.asked.{request}.{placement}.{error is not None}", "asked", InterviewPlaced(
            run_id="r1", request=request, after_round=1, survey=PANEL.survey, expected=40, placed_at=1e9,
            hosts={"a": [(0, 10)], "b": [(10, 10)]}, error=error, placement=placement))

    store.ingest([order("a", [(0, 10)]), order("b", [(10, 10)]), placed()])
    assert ingest(store, answers(range(10), request="iv-1"), answers(range(10, 14), host="b", request="iv-1")
                  ).answers == 28
    assert store.interviews.complete_requests() == []
    store.ingest([order("a", [(10, 10)], placement=1), placed(placement=1)])  # b lost: a answers its agents
    again = ingest(store, answers(range(10, 20), request="iv-1", answer="no"))
    assert again.answers == 12 and not again.refused  # 10..13 answered by b already
    assert store.interviews.complete_requests() == [("r1", "iv-1", 40)]
    assert store.interviews.complete_requests() == []  # announced once
    assert count(store, "request = 'iv-1'") == 40 and count(store, "request = 'iv-1' AND host_id = 'b'") == 8

    store.ingest([order("a", [(0, 20)], request="iv-2"), placed("iv-2"),
                  placed("iv-2", error="agent-host a stopped (no heartbeat for 30s) …")])
    ingest(store, answers(range(20), request="iv-2"))
    assert store.interviews.complete_requests() == []  # failed: never announced, though its answers came
    assert store.con.execute("SELECT error FROM interview_requests WHERE request = 'iv-2'").fetchone() == (
        "agent-host a stopped (no heartbeat for 30s) …",)


def test_a_post_hoc_request_is_answered_only_as_its_orders_ask(tmp_path):
    """Issue 41, attacks 4 and 6: host a, ordered to answer iv-1 (survey `panel` after round 2),
    sends first a batch with no answers and other questions under `panel`: it once became the
    survey, and every real batch was refused ("asked with other questions"); then answers for
    its own agents after round 1: once kept (60 rows for a 40-answer request), and the request
    announced complete before b answered. Now each is refused against the order, and the
    request completes with exactly its answers."""
    from populace.core.contracts import InterviewPlaced

    store = Store(tmp_path / "x.duckdb")
    start(store)
    restore = Restore(run_id="r1", round=2, ranges=[(0, 10), (10, 10)])
    half = PlannedInterview(id="iv-half", after=[2], sample=0.5, questions=[CAR])

    def order(host, ranges, request="iv-1", survey=PANEL.survey, sample=None):
        return Event(f"r1.ask.{request}.{host}", "ask", InterviewOrder(
            run_id="r1", host_id=host, request=request, after_round=2, survey=survey, ranges=ranges, sample=sample,
            restore=restore, config_ref=ConfigRef.of(CONFIG)))

    store.ingest([order("a", [(0, 10)]), order("b", [(10, 10)]),
                  Event("r1.asked.iv-1", "asked", InterviewPlaced(
                      run_id="r1", request="iv-1", after_round=2, survey=PANEL.survey, expected=40, placed_at=1e9,
                      hosts={"a": [(0, 10)], "b": [(10, 10)]}))])
    swap = answers([], round_=2, plan=PlannedInterview(id="panel", after="every", questions=[TRUST]), request="iv-1")
    early = answers(range(10), round_=1, request="iv-1")
    out = ingest(store, swap, early)
    assert out.answers == 0 and [why for _, why in out.refused] == [
        "request 'iv-1' asks survey 'panel' with its own questions; this batch answers 'panel' with other ones",
        "request 'iv-1' asks after round 2, not after round 1"]
    assert store.con.execute("SELECT count(*) FROM interview_questions").fetchone() == (0,)
    assert ingest(store, answers(range(10), round_=2, request="iv-1")).answers == 20
    assert store.interviews.complete_requests() == []  # b has not answered
    assert ingest(store, answers(range(10, 20), host="b", round_=2, request="iv-1")).answers == 20
    assert store.interviews.complete_requests() == [("r1", "iv-1", 40)]
    assert count(store, "request = 'iv-1' AND after_round = 2") == 40 and count(store, "request = 'iv-1'") == 40
    asked = store.con.execute("SELECT question FROM interview_questions WHERE request = 'iv-1' AND position >= 0 "
                              "ORDER BY position").fetchall()
    assert asked == [("car",), ("trust",)]  # the order's questions
    # a sample of the host's ranges: answers only for the agents it chooses
    store.ingest([order("a", [(0, 10)], request="iv-half", survey=half.survey, sample=0.5)])
    chosen = set(respondents(20, seed=5, survey_id="iv-half", sample=0.5).tolist())
    unchosen = answers([next(a for a in range(10) if a not in chosen)], round_=2, plan=half, request="iv-half")
    out = ingest(store, unchosen)
    assert [why for _, why in out.refused] == ["request 'iv-half' does not choose every agent of the batch"]
    assert ingest(store, answers(sorted(a for a in chosen if a < 10), round_=2, plan=half,
                                 request="iv-half")).answers == len([a for a in chosen if a < 10])
