"""The orchestrator's decisions about post-hoc interviews (populace.orchestrator.interviews),
pure: what it refuses (a fork's rounds are its parent's), and, for an interview in flight, a
lost host's part ordered from the hosts up, a failure said when none is, a recorded interview
watched no more, and a host's fault heard only from a host ordered to answer."""

from __future__ import annotations

from populace.core.contracts import (
    AskedShare,
    Asking,
    HostInfo,
    InterviewRequest,
    Question,
    Restore,
    RunConfig,
    RunFault,
    RunState,
    Survey,
)
from populace.orchestrator import interviews as iv
from populace.orchestrator.workflow import fork_run, new_run, state_ref

SURVEY = Survey(id="later", questions=[Question(id="car", text="A car?", options=["yes", "no"])])


def host(host_id: str, started_at: float = 1.0) -> HostInfo:
    return HostInfo(host_id=host_id, capacity=1000, pid=1, started_at=started_at, heartbeat_at=0.0)


def asking(request: str = "iv-1", shares=(("h1", [(0, 3000)]), ("h2", [(3000, 1000)]))) -> Asking:
    return Asking(request=request, after_round=2, expected=4000, order_seq=9, placed_at=1.0,
                  shares=[AskedShare(host_id=h, ranges=r, incarnation=1.0) for h, r in shares])


def done_run(*asked: Asking) -> RunState:
    state = new_run("r", RunConfig(agents=4000, rounds=3), {"h1": [(0, 3000)], "h2": [(3000, 1000)]})
    return state.model_copy(update={"status": "done", "round": 3, "asking": list(asked)})


def test_a_lost_hosts_part_is_ordered_from_the_hosts_up_and_the_rest_stays():
    state = done_run(asking())
    hosts = [host("h1"), host("h3")]
    new, actions = iv.on_beat(state, hosts, {"h1", "h3"}, set(), 30)
    (order,) = actions
    assert isinstance(order, iv.OrderAgain)
    assert order.hosts == {"h3": [(3000, 1000)]} and order.placement == 1
    assert order.reason == ("agent-host h2 stopped (no heartbeat for 30s) while answering interview iv-1 after round "
                            "2: its 1000 agents ordered again from h3")
    (a,) = new.asking
    assert a.placements == 1 and a.hosts == {"h1": [(0, 3000)], "h3": [(3000, 1000)]}
    assert [(sh.host_id, sh.placement, sh.incarnation) for sh in a.shares] == [("h1", 0, 1.0), ("h3", 1, 1.0)]
    assert new.updated_at == state.updated_at  # asking is not running: "the last run" stays what it was
    # the next beat, nothing more is lost: nothing changes
    assert iv.on_beat(new, hosts, {"h1", "h3"}, set(), 30) == (new, [])


def test_a_restarted_host_has_lost_its_order_and_may_take_it_back():
    state = done_run(asking(shares=(("h1", [(0, 4000)]),)))
    new, (order,) = iv.on_beat(state, [host("h1", started_at=5.0)], {"h1"}, set(), 30)
    assert order.hosts == {"h1": [(0, 4000)]} and "agent-host h1 restarted" in order.reason
    assert new.asking[0].shares == [AskedShare(host_id="h1", ranges=[(0, 4000)], incarnation=5.0, placement=1)]


def test_with_no_host_up_the_interview_fails_saying_why_and_is_watched_no_more():
    state = done_run(asking(), asking("iv-2", shares=(("h1", [(0, 4000)]),)))
    new, actions = iv.on_beat(state, [host("h1", started_at=2.0)], {"h2"}, set(), 4)  # h1 has not beaten since
    assert new.asking == []
    assert actions == [
        iv.InterviewLost("iv-1", 2, 4000, "agent-host h1 stopped (no heartbeat for 4s) while answering interview "
                         "iv-1 after round 2, and no agent-host is up to answer its 3000 agents; the answers recorded "
                         "so far stay"),
        iv.InterviewLost("iv-2", 2, 4000, "agent-host h1 stopped (no heartbeat for 4s) while answering interview "
                         "iv-2 after round 2, and no agent-host is up to answer its 4000 agents; the answers recorded "
                         "so far stay")]


def test_a_recorded_interview_is_watched_no_more_even_if_its_host_is_gone():
    state = done_run(asking(), asking("iv-2"))
    new, actions = iv.on_beat(state, [host("h1"), host("h2")], {"h1", "h2"}, {"iv-1"}, 30)
    assert actions == [] and [a.request for a in new.asking] == ["iv-2"]
    new, actions = iv.on_beat(new, [], set(), {"iv-2"}, 30)
    assert actions == [] and new.asking == []


def test_a_placement_is_watched_once_and_a_failure_decided_once():
    state = done_run()
    once, _ = iv.asked(state, asking())
    assert iv.asked(once, asking()) == (once, [])  # the request delivered again
    assert iv.failed(once, "iv-1", "h9") == (once, [])  # h9 has no part of it
    gone, _ = iv.failed(once, "iv-1", "h2")
    assert gone.asking == [] and iv.failed(gone, "iv-1") == (gone, [])


def test_a_hosts_fault_counts_only_from_a_host_ordered_to_answer():
    state = done_run(asking())
    fault = RunFault(run_id="r", source="h2", reason="ModelUnavailable: no gateway", request="iv-1")
    assert iv.fault_refusal(state, fault, "run.r.fault.h2") is None
    assert "h9 was not ordered to answer interview iv-1" in iv.fault_refusal(
        state, fault.model_copy(update={"source": "h9"}), "run.r.fault.h9")
    assert "claims to come from 'h2'" in iv.fault_refusal(state, fault, "run.r.fault.h9")
    assert iv.fault_refusal(None, fault, "run.r.fault.h2") == "run r is not known"


def test_a_fork_is_not_asked_after_a_round_its_parent_played():
    parent = done_run()
    fork = fork_run("f", RunConfig(agents=4000, rounds=5), {"h1": [(0, 4000)]}, parent, 2,
                    state_ref(parent.run_id, 2, "e" * 64), {})
    fork = fork.model_copy(update={"status": "done", "round": 5})
    for k in (1, 2):
        req = InterviewRequest(run_id="f", request="iv-1", after_round=k, survey=SURVEY)
        assert iv.refusal(fork, req) == (f"after_round: this fork never played round {k}; its parent r did (the fork "
                                         f"starts from its state after round 2: `populace interview r "
                                         f"--after-round {k}`)")
    assert iv.refusal(fork, InterviewRequest(run_id="f", request="iv-1", after_round=3, survey=SURVEY)) is None
    # a resumed run restores from its own checkpoint: every round is its own
    resumed = parent.model_copy(update={"restore": Restore(run_id="r", round=2)})
    assert iv.never_played(resumed, 1) is None
