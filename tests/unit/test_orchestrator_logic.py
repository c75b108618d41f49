"""Orchestrator policy, pure: placement of agent ids on hosts, and the run workflow."""

from __future__ import annotations

import random

import pytest

from populace.core.contracts import HostInfo, RoundResult, RunConfig, RunState, StateRef
from populace.core.placement import PlacementError, place
from populace.orchestrator.workflow import FinishRun, OpenRound, new_run, on_failure, on_result, on_spawned


def host(host_id: str, capacity: int, agents: int = 0) -> HostInfo:
    return HostInfo(host_id=host_id, capacity=capacity, agents=agents, pid=1, started_at=0.0, heartbeat_at=0.0)


def even_quotas(agents: int, free: dict[str, int]) -> dict[str, float]:
    """What `spread` aims at: the same share for every host with room, none above its room
    (the level found by bisection, independently of placement.py's water-filling)."""
    lo, hi = 0.0, float(agents)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(min(f, mid) for f in free.values() if f > 0) < agents else (lo, mid)
    return {h: min(f, hi) for h, f in free.items() if f > 0}


def check_placement(agents: int, hosts: list[HostInfo], out: dict[str, list[tuple[int, int]]],
                    policy: str = "capacity") -> None:
    free = {h.host_id: max(0, h.capacity - h.agents) for h in hosts}
    total_free = sum(free.values())
    # every agent exactly once: ranges contiguous, non-overlapping, covering 0..agents-1
    ranges = sorted(r for rs in out.values() for r in rs)
    assert all(cnt > 0 for _, cnt in ranges)
    nxt = 0
    for first, cnt in ranges:
        assert first == nxt
        nxt = first + cnt
    assert nxt == agents
    for h, rs in out.items():
        count = sum(cnt for _, cnt in rs)
        assert free[h] > 0, f"{h} has no free capacity but got agents"
        assert count <= free[h], f"{h} over capacity"
    quotas = even_quotas(agents, free) if policy == "spread" else {h: agents * f / total_free for h, f in free.items()}
    for h, q in quotas.items():
        count = sum(cnt for _, cnt in out.get(h, []))
        assert abs(count - q) < 1 + 1e-9, f"{h}: {count} agents, its quota is {q} ({policy})"


# --- placement -------------------------------------------------------------------------------
@pytest.mark.parametrize("agents", [1, 2, 3, 7, 13, 97, 100, 101, 997, 1000, 7919, 10007, 99991])
@pytest.mark.parametrize("n_hosts", [1, 2, 3, 6, 7])
def test_equal_hosts_exact_total(agents, n_hosts):
    hosts = [host(f"h{i}", 100_000) for i in range(n_hosts)]
    out = place(agents, hosts)
    check_placement(agents, hosts, out)
    counts = [sum(c for _, c in out.get(h.host_id, [])) for h in hosts]
    assert max(counts) - min(counts) <= 1  # equal free capacity: equal shares, give or take one


@pytest.mark.parametrize("policy", ["spread", "capacity"])
@pytest.mark.parametrize("seed", range(40))
def test_random_hosts(seed, policy):
    rng = random.Random(seed)
    hosts = []
    for i in range(rng.randint(1, 12)):
        cap = rng.randint(1, 5000)
        used = rng.choice([0, 0, rng.randint(0, cap), cap, cap + 10])
        hosts.append(host(f"host-{i:02d}", cap, used))
    total_free = sum(max(0, h.capacity - h.agents) for h in hosts)
    if total_free == 0:
        with pytest.raises(PlacementError):
            place(1, hosts)
        return
    for agents in {1, total_free, rng.randint(1, total_free), max(1, total_free // 3)}:
        out = place(agents, hosts, policy=policy)
        check_placement(agents, hosts, out, policy)


def test_proportional_to_free_capacity():
    hosts = [host("a", 1000, 0), host("b", 1000, 500), host("c", 3000, 1000)]  # free 1000, 500, 2000
    out = place(700, hosts, policy="capacity")
    assert {h: sum(c for _, c in rs) for h, rs in out.items()} == {"a": 200, "b": 100, "c": 400}
    assert out == {"a": [(0, 200)], "b": [(200, 100)], "c": [(300, 400)]}


def test_by_default_a_run_is_spread_evenly_whatever_a_host_claims():
    """Issue 26, 5: a host that wrote a capacity of 10^8 into its own registry entry got 1,961
    of 2,000 agents; a claim now only bounds what a host gets."""
    hosts = [host("host-0", 2_000_000), host("host-1", 100_000_000)]
    assert place(2000, hosts) == {"host-0": [(0, 1000)], "host-1": [(1000, 1000)]}
    assert place(2000, hosts, policy="capacity") == {"host-0": [(0, 39)], "host-1": [(39, 1961)]}


def test_spread_fills_the_hosts_with_least_room_and_spreads_the_rest():
    hosts = [host("a", 100), host("b", 10_000, 9_000), host("c", 10_000), host("d", 50, 50)]  # free 100, 1000, 10000
    out = place(3000, hosts)
    assert out == {"a": [(0, 100)], "b": [(100, 1000)], "c": [(1100, 1900)]}
    check_placement(3000, hosts, out, "spread")
    # groups of 7 stay whole: a takes 14 groups (98 agents), the rest evenly
    grouped = place(3000, hosts, unit=7)
    assert {h: sum(c for _, c in rs) for h, rs in grouped.items()} == {"a": 98, "b": 994, "c": 1908}


@pytest.mark.parametrize("seed", range(30))
def test_on_hosts_of_equal_room_both_policies_place_alike(seed):
    """The local runner splits a run over equal virtual hosts with `place`: its shares (and so
    its results) are the same under the new default as they were."""
    rng = random.Random(seed)
    agents, n, unit = rng.randint(1, 50_000), rng.randint(1, 9), rng.choice([1, 1, 2, 3, 5, 10])
    hosts = [host(f"host-{i:04d}", agents) for i in range(n)]
    assert place(agents, hosts, unit=unit) == place(agents, hosts, unit=unit, policy="capacity")


@pytest.mark.parametrize("policy", ["spread", "capacity"])
@pytest.mark.parametrize("seed", range(60))
def test_groups_stay_whole_and_no_host_gets_more_than_its_room(seed, policy):
    """The last group may be smaller than the others: only the host that gets it (the last in
    id order) may count it in its room. Counted for any host, a host before it got a whole
    group more than its free capacity."""
    rng = random.Random(seed)
    unit = rng.randint(2, 9)
    hosts = [host(f"h{i}", rng.randint(1, 60), rng.choice([0, 0, rng.randint(0, 20)]))
             for i in range(rng.randint(1, 5))]
    free = {h.host_id: max(0, h.capacity - h.agents) for h in hosts}
    for agents in range(1, sum(free.values()) + 1):
        try:
            out = place(agents, hosts, unit=unit, policy=policy)
        except PlacementError:
            continue
        last_first, last_count = max(r for rs in out.values() for r in rs)
        assert last_first + last_count == agents
        for h, rs in out.items():
            assert sum(c for _, c in rs) <= free[h], (agents, unit, h, out, free)
            assert all(f % unit == 0 for f, _ in rs)


def test_a_capacity_claim_is_bounded_by_the_operators_setting():
    from populace.core.placement import bounded

    hosts = [host("a", 100_000_000), host("b", 500)]
    capped, over = bounded(hosts, 1000)
    assert [h.capacity for h in capped] == [1000, 500] and over == [hosts[0]]
    assert bounded(hosts, 0) == (hosts, []) and bounded(hosts, None) == (hosts, [])
    assert place(1500, capped, policy="capacity") == {"a": [(0, 1000)], "b": [(1000, 500)]}
    with pytest.raises(PlacementError, match="room for 1500"):
        place(1600, capped)
    with pytest.raises(PlacementError, match="policy"):
        place(10, hosts, policy="largest")  # type: ignore[arg-type]


def test_a_host_may_not_claim_a_negative_load():
    with pytest.raises(ValueError, match="agents"):
        host("a", 10, -100_000_000)


def test_largest_remainder_goes_to_biggest_fraction():
    hosts = [host("a", 10), host("b", 10), host("c", 10)]
    out = place(10, hosts)
    counts = sorted(sum(c for _, c in rs) for rs in out.values())
    assert counts == [3, 3, 4]
    check_placement(10, hosts, out)


def test_full_hosts_are_excluded():
    hosts = [host("full", 100, 100), host("over", 100, 150), host("free", 100, 0)]
    out = place(60, hosts)
    assert out == {"free": [(0, 60)]}


def test_fills_all_capacity_exactly():
    hosts = [host("a", 3), host("b", 5, 1), host("c", 7, 2)]  # free 3 + 4 + 5 = 12
    out = place(12, hosts)
    assert {h: sum(c for _, c in rs) for h, rs in out.items()} == {"a": 3, "b": 4, "c": 5}


def test_not_enough_capacity():
    with pytest.raises(PlacementError, match="room for 12"):
        place(13, [host("a", 3), host("b", 5, 1), host("c", 7, 2)])


@pytest.mark.parametrize("hosts", [[], [host("a", 5, 5)], [host("a", 5, 9), host("b", 1, 1)]])
def test_no_usable_hosts(hosts):
    with pytest.raises(PlacementError):
        place(1, hosts)


@pytest.mark.parametrize("agents", [0, -1])
def test_agents_must_be_positive(agents):
    with pytest.raises(PlacementError):
        place(agents, [host("a", 10)])


def test_placement_error_is_value_error():
    assert issubclass(PlacementError, ValueError)


def test_placement_is_deterministic_regardless_of_host_order():
    hosts = [host(f"h{i}", 100 + 37 * i, i) for i in range(9)]
    ref = place(555, hosts)
    rng = random.Random(3)
    for _ in range(10):
        shuffled = hosts[:]
        rng.shuffle(shuffled)
        assert place(555, shuffled) == ref


# --- workflow ------------------------------------------------------------------------------------
CONFIG = RunConfig(agents=10, rounds=3)
PLACEMENT = {"h1": [(0, 6)], "h2": [(6, 4)]}


def result(round_: int, winner_value: float | None = 20.0, run_id: str = "r1",
           shares: tuple[str, ...] = ("h1@0", "h2@0")) -> RoundResult:
    """A round result as the ratio game's environment would decide it: the orchestrator keeps
    the environment's state and next observation without reading them."""
    valid = winner_value is not None
    winners = [winner_value] if valid else []
    return RoundResult(run_id=run_id, round=round_, n=10, n_valid=10 if valid else 0,
                       summary={"mean": 30.0 if valid else None, "winner_value": winner_value},
                       observation={"history": winners, "tag": round_}, closed_at=float(round_), shares=list(shares),
                       env_checkpoint=env_ref(round_, run_id).digest)


def env_ref(round_: int, run_id: str = "r1") -> StateRef:
    """Where round `round_`'s environment state is, as `result(round_)` names it."""
    return StateRef(name=f"{run_id}.{round_}.env", digest=format(round_, "064x"))


def running_state() -> RunState:
    s = new_run("r1", CONFIG, PLACEMENT)
    s, _ = on_spawned(s, "h1")
    s, acts = on_spawned(s, "h2")
    assert acts == [OpenRound(1, 10)]
    return s


def test_new_run():
    s = new_run("r1", CONFIG, PLACEMENT)
    assert (s.run_id, s.status, s.round, s.spawned, s.env_state, s.observation) == (
        "r1", "spawning", 0, [], None, None)
    assert s.placement == PLACEMENT and s.config == CONFIG


def test_spawned_from_all_hosts_opens_round_one_exactly_once():
    s0 = new_run("r1", CONFIG, PLACEMENT)
    s1, a1 = on_spawned(s0, "h2")
    assert a1 == []
    assert s1.status == "spawning" and s1.spawned == ["h2@0"] and s1.round == 0
    assert s0.spawned == []  # the input state is not mutated

    again, a = on_spawned(s1, "h2")
    assert again is s1 and a == []

    s2, a2 = on_spawned(s1, "h1")
    assert a2 == [OpenRound(round=1, expected=10)]
    assert s2.status == "running" and s2.round == 1 and sorted(s2.spawned) == ["h1@0", "h2@0"]

    for h in ("h1", "h2"):
        s3, a3 = on_spawned(s2, h)
        assert s3 is s2 and a3 == []


def test_spawned_from_unknown_host_is_ignored():
    s0 = new_run("r1", CONFIG, PLACEMENT)
    s1, acts = on_spawned(s0, "stranger")
    assert s1 is s0 and acts == []


def test_single_host_opens_immediately():
    s, acts = on_spawned(new_run("r1", CONFIG, {"only": [(0, 10)]}), "only")
    assert acts == [OpenRound(1, 10)] and s.status == "running"


def test_results_advance_rounds_and_carry_the_environments_state():
    s = running_state()
    s, acts = on_result(s, result(1, 20.0))
    assert acts == [OpenRound(2, 10)] and s.round == 2
    assert s.env_state == env_ref(1) and s.observation == {"history": [20.0], "tag": 1}
    s, acts = on_result(s, result(2, 13.5))
    assert acts == [OpenRound(3, 10)] and s.round == 3 and s.env_state == env_ref(2)
    s, acts = on_result(s, result(3, 9.0))
    assert acts == [FinishRun("completed", 3)]
    assert s.status == "done" and s.env_state == env_ref(3) and s.round == 3
    # nothing happens after the run is done
    s2, acts = on_result(s, result(3, 9.0))
    assert s2 is s and acts == []
    s3, acts = on_result(s, result(4, 1.0))
    assert s3 is s and acts == []


def test_result_for_wrong_round_is_ignored():
    s = running_state()
    for r in (2, 3):  # round 0 is refused by the wire model itself
        s2, acts = on_result(s, result(r))
        assert s2 is s and acts == []
    s, _ = on_result(s, result(1))
    replay, acts = on_result(s, result(1))  # replayed result of the previous round
    assert replay is s and acts == []


def test_result_before_running_is_ignored():
    s = new_run("r1", CONFIG, PLACEMENT)
    s2, acts = on_result(s, result(1))
    assert s2 is s and acts == []


def test_a_result_naming_no_checkpoint_of_the_environments_state_pauses_the_run():
    """The next round starts from the state the result's checkpoint holds (a reference in KV
    runs): a result without one cannot be continued from, so the run pauses naming it, after
    its last completed round, and keeps the state it had."""
    s = running_state()
    s, _ = on_result(s, result(1))
    s, acts = on_result(s, result(2).model_copy(update={"env_checkpoint": None}))
    assert s.status == "paused" and "round 2's result names no checkpoint of the environment's state" in s.reason
    assert s.env_state == env_ref(1) and not any(isinstance(a, OpenRound) for a in acts)


def test_round_without_winner_still_opens_the_next():
    s = running_state()
    s, acts = on_result(s, result(1, None))
    assert s.env_state == env_ref(1) and acts == [OpenRound(2, 10)]


def test_one_round_run_finishes_on_first_result():
    s, _ = on_spawned(new_run("r1", RunConfig(agents=10, rounds=1), {"h": [(0, 10)]}), "h")
    assert on_result(s, result(1, 7.0)) == (s, [])  # folded shares the run does not have
    s, acts = on_result(s, result(1, 7.0, shares=("h@0",)))
    assert acts == [FinishRun("completed", 1)] and s.status == "done" and s.env_state == env_ref(1)


def test_states_stay_valid_models():
    s = running_state()
    s, _ = on_result(s, result(1, 20.0))
    assert RunState.model_validate_json(s.model_dump_json()) == s


def test_failure_while_running():
    s = running_state()
    s, _ = on_result(s, result(1))
    f, acts = on_failure(s, "host h2 lost")
    assert f.status == "failed" and f.reason == "host h2 lost"
    # rounds counts completed rounds: round 2 was in play, round 1 is what a resume keeps
    assert acts == [FinishRun("failed", 1, "host h2 lost")] and f.round == 1
    # failing again, or a late result, does nothing
    f2, acts = on_failure(f, "again")
    assert f2 is f and acts == []
    f3, acts = on_result(f, result(2))
    assert f3 is f and acts == []
    f4, acts = on_spawned(f, "h1")
    assert f4 is f and acts == []


def test_failure_while_spawning():
    s = new_run("r1", CONFIG, PLACEMENT)
    f, acts = on_failure(s, "spawn timed out")
    assert f.status == "failed" and acts == [FinishRun("failed", 0, "spawn timed out")]
    f2, acts = on_spawned(f, "h1")
    assert f2 is f and acts == []


def test_failure_after_done_is_ignored():
    s = running_state()
    for r in (1, 2, 3):
        s, _ = on_result(s, result(r))
    assert s.status == "done"
    s2, acts = on_failure(s, "too late")
    assert s2 is s and acts == [] and s2.reason is None


# --- lost hosts: their shares placed again ----------------------------------------------
def hinfo(host_id: str, started_at: float = 1.0, agents: int = 0, capacity: int = 1000) -> HostInfo:
    return HostInfo(host_id=host_id, capacity=capacity, agents=agents, pid=1, started_at=started_at,
                    heartbeat_at=0.0)


def _running(placement, rounds: int = 5) -> RunState:
    s = new_run("r", RunConfig(agents=sum(c for rs in placement.values() for _, c in rs), rounds=rounds), placement,
                dict.fromkeys(placement, 1.0))
    for h in placement:
        s, _ = on_spawned(s, h)
    s, _ = on_result(s, result(1, run_id="r", shares=tuple(f"{h}@0" for h in sorted(placement))))
    assert s.status == "running" and s.round == 2
    return s


def test_a_silent_hosts_share_is_placed_again_on_the_hosts_up_and_replays_the_round_in_play():
    from populace.orchestrator import workflow

    state = _running({"h1": [(0, 10)], "h2": [(10, 15), (25, 5)], "h3": [(30, 10)]})
    up = [hinfo("h1", agents=10), hinfo("h3", agents=10)]
    new, actions = workflow.on_hosts_lost(state, up, {"h1", "h3"}, 30.0)
    assert new.status == "running" and new.epoch == 1 and new.round == 2
    moved = [sh for sh in new.shares if sh.epoch == 1]
    assert sorted(r for sh in moved for r in sh.ranges) == [(10, 10), (20, 10)]  # h2's 20 agents, split
    assert {sh.host_id for sh in moved} == {"h1", "h3"} and all(sh.from_round == 2 for sh in moved)
    assert actions == [workflow.SpawnShares(tuple(sh.key for sh in moved))]
    assert new.reason \
        == "agent-host h2 stopped (no heartbeat for 30s) during round 2: its 20 agents re-placed on h1, h3"
    # the survivors keep their shares (and what they already played)
    assert new.spawned == ["h1@0", "h3@0"]
    # the replacements restore from round 1's checkpoint, written in the old layout
    restore = workflow.restore_point(new)
    assert (restore.run_id, restore.round, restore.ranges) == ("r", 1, [(0, 10), (10, 15), (25, 5), (30, 10)])
    # once they spawned, round 2 is announced again (for them); then a result must fold them
    s = new
    for sh in moved:
        s, acts = on_spawned(s, sh.host_id, sh.epoch)
    assert acts == [OpenRound(2, 40, again=True)]
    stale = result(2, run_id="r", shares=("h1@0", "h2@0", "h3@0"))
    assert on_result(s, stale) == (s, [])
    s, acts = on_result(s, result(2, run_id="r", shares=tuple(sorted(sh.key for sh in s.shares))))
    assert acts == [OpenRound(3, 40)]


def test_a_restarted_host_loses_its_share_at_once_and_may_take_it_back():
    from populace.orchestrator import workflow

    state = _running({"h1": [(0, 10)], "h2": [(10, 10)]})
    restarted = [hinfo("h1", agents=10), hinfo("h2", started_at=9.0)]  # h2 heartbeats, as a new process
    new, _ = workflow.on_hosts_lost(state, restarted, {"h1", "h2"}, 30.0)
    assert new.reason.startswith("agent-host h2 restarted during round 2")
    moved = [sh for sh in new.shares if sh.epoch == 1]
    assert sum(sh.count for sh in moved) == 10 and all(sh.incarnation is not None for sh in moved)
    # placed again, the share belongs to the new process: no loss seen twice
    assert workflow.on_hosts_lost(new.model_copy(update={"shares": [*new.shares]}), [
        hinfo("h1", agents=10 + sum(sh.count for sh in moved if sh.host_id == "h1")),
        hinfo("h2", started_at=9.0, agents=sum(sh.count for sh in moved if sh.host_id == "h2"))],
        {"h1", "h2"}, 30.0)[1] == []


def test_with_nowhere_to_place_a_lost_share_the_run_pauses_with_a_reason():
    from populace.orchestrator import workflow

    state = _running({"h1": [(0, 10)], "h2": [(10, 10)]})
    new, actions = workflow.on_hosts_lost(state, [hinfo("h1", agents=10, capacity=10)], {"h1"}, 30.0)
    assert new.status == "paused" and new.round == 1
    assert new.reason.startswith("agent-host h2 stopped (no heartbeat for 30s) during round 2 and no agent-host "
                                 "can take its 10 agents")
    assert new.reason.endswith("`populace resume r` continues once hosts are up")
    assert actions == [workflow.FinishRun("paused", 1, new.reason)]


def test_live_hosts_or_finished_runs_are_left_alone():
    from populace.orchestrator import workflow

    state = _running({"h1": [(0, 10)], "h2": [(10, 20)]})
    hosts = [hinfo("h1"), hinfo("h2"), hinfo("h3")]
    assert workflow.on_hosts_lost(state, hosts, {"h1", "h2", "h3"}, 30.0) == (state, [])
    done = state.model_copy(update={"status": "done"})
    assert workflow.on_hosts_lost(done, [], set(), 30.0) == (done, [])


def test_a_round_without_progress_is_announced_again_once_then_the_run_pauses():
    from populace.orchestrator import workflow

    state = _running({"h1": [(0, 10)]})
    assert workflow.on_stalled(state, 59.0, 60.0) == (state, [])
    nudged, acts = workflow.on_stalled(state, 61.0, 60.0)
    assert acts == [OpenRound(2, 10, again=True)] and nudged.nudged == 1
    paused, acts = workflow.on_stalled(nudged, 61.0, 60.0)
    assert paused.status == "paused" and paused.round == 1 and acts[0].status == "paused"
    assert "round 2 made no progress for 60s (announced again once)" in paused.reason
    assert workflow.stall_deadline(RunConfig(agents=1), 60.0, 3) == 210.0
    assert workflow.stall_deadline(RunConfig(agents=1), 60.0, 3, override=5.0) == 5.0
    assert "a service is down or stuck" in paused.reason


def test_a_round_stalled_by_a_host_whose_loop_is_held_pauses_naming_it_not_as_a_lost_host():
    """A host beats from its own thread: its loop held by the simulation's code for good keeps it
    registered; the round's deadline pauses the run naming the host and how long its loop has not
    turned (from its heartbeat), and its agents are not placed on another host."""
    from populace.orchestrator import workflow

    nudged, _ = workflow.on_stalled(_running({"h1": [(0, 10)]}), 61.0, 60.0)
    paused, acts = workflow.on_stalled(nudged, 61.0, 60.0, busy={"h1": 212.4})
    assert paused.status == "paused" and acts[0].status == "paused"
    assert ("the simulation's code holds the event loop of agent-host h1 (212s without a turn) (a view, turn, "
            "settle or scene that does not return; fix it first)") in paused.reason
    assert paused.epoch == nudged.epoch  # placed nowhere else


# --- steering: cancel, resume, fork ----------------------------------------------------------
def test_cancel_keeps_the_last_completed_round_and_drops_the_one_in_play():
    from populace.orchestrator.workflow import on_cancel

    s = running_state()
    s, _ = on_result(s, result(1))
    s, _ = on_result(s, result(2))  # round 3 in play
    c, acts = on_cancel(s, "enough")
    assert c.status == "cancelled" and c.round == 2 and c.reason == "enough"
    assert acts == [FinishRun("cancelled", 2, "enough")]
    assert on_cancel(c, "again") == (c, [])  # a stopped run cancels once
    assert on_result(c, result(3)) == (c, [])  # the dropped round's late result changes nothing


def test_resume_plays_on_in_a_new_epoch_from_the_last_checkpoint_on_the_hosts_up_now():
    from populace.orchestrator.workflow import SpawnShares, layout_for, on_cancel, on_resume, restore_point

    s = running_state()
    s, _ = on_result(s, result(1))
    s, _ = on_cancel(s, "x")
    moved = {"h3": [(0, 10)]}
    r, acts = on_resume(s, moved)
    assert acts == [SpawnShares(("h3@1",), resumed=True)]
    assert (r.status, r.epoch, r.round, r.placement, r.spawned, r.reason) == ("spawning", 1, 1, moved, [], None)
    # the checkpoint of round 1 was written in the old layout (two hosts' ranges)
    restore = restore_point(r)
    assert restore.run_id == "r1" and restore.round == 1 and restore.ranges == layout_for(s, 1)
    assert layout_for(r, 1) == sorted(x for rs in PLACEMENT.values() for x in rs) and layout_for(r, 2) == [(0, 10)]
    # the old epoch's spawn and result are stale; the new epoch's spawn opens round 2
    assert on_spawned(r, "h3", epoch=0) == (r, [])
    r2, acts = on_spawned(r, "h3", epoch=1)
    assert acts == [OpenRound(2, 10)] and r2.status == "running" and r2.round == 2
    assert on_result(r2, result(2)) == (r2, [])  # epoch 0's round 2
    done, acts = on_result(r2, result(2, shares=("h3@1",)))
    assert acts == [OpenRound(3, 10)] and done.round == 3


def test_a_control_request_delivered_again_or_overtaken_changes_nothing():
    """A cancel or resume is handled at least once: its handler may die between the state's
    write and the ack, and the request comes again, maybe after a newer one changed the run."""
    from populace.orchestrator.workflow import Request, on_cancel, on_resume, stale

    s = running_state()
    s, _ = on_result(s, result(1))
    cancel, resume = Request(seq=7, at=1000.0), Request(seq=8, at=1001.0)
    c, acts = on_cancel(s, "x", cancel)
    assert acts and (c.request_seq, c.request_at) == (7, 1000.0)
    r, acts = on_resume(c, PLACEMENT, request=resume)
    assert acts and r.status == "spawning" and (r.request_seq, r.request_at) == (8, 1001.0)
    assert on_cancel(r, "x", cancel) == (r, [])  # the first cancel again, after the resume it preceded
    again, _ = on_cancel(r, "y", Request(seq=9, at=1002.0))  # a newer cancel still stops it
    assert again.status == "cancelled" and again.request_seq == 9
    assert on_resume(again, PLACEMENT, request=resume) == (again, [])  # the resume again: not a second one
    assert on_resume(again, PLACEMENT, request=Request(seq=10, at=1003.0))[0].epoch == 2
    # a CTL stream made anew counts from 1 again: its requests are later in time, so they count
    assert not stale(again, Request(seq=1, at=1005.0)) and on_cancel(r, "z", Request(seq=1, at=1005.0))[1]
    assert stale(again, Request(seq=9, at=1002.0)) and not stale(again, None)
    # a request that changes nothing (the run is stopped already) leaves no mark
    assert on_cancel(c, "again", Request(seq=11, at=1004.0)) == (c, [])


def test_a_stop_is_said_until_published_so_a_restarted_orchestrator_says_it_again():
    """Between a stop's state write and its RunDone the orchestrator may die (or the publish fail):
    the state says the stop is unannounced, and whoever reads it next publishes it."""
    from populace.orchestrator.workflow import on_cancel, on_resume, on_stop_announced, unannounced_stop

    s = running_state()
    assert s.stop_announced and unannounced_stop(s) is None  # running: nothing to say
    s, _ = on_result(s, result(1))
    c, acts = on_cancel(s, "enough")
    assert not c.stop_announced and unannounced_stop(c) == acts[0] == FinishRun("cancelled", 1, "enough")
    said, acts = on_stop_announced(c, c.epoch)
    assert said.stop_announced and acts == [] and unannounced_stop(said) is None
    assert on_stop_announced(said, said.epoch) == (said, [])
    r, _ = on_resume(c, PLACEMENT)  # resumed before it was said: the old stop is not said any more
    assert unannounced_stop(r) is None and on_stop_announced(r, c.epoch) == (r, [])
    for n in range(1, CONFIG.rounds + 1):
        s, acts = on_result(s, result(n))
    assert s.status == "done" and unannounced_stop(s) == acts[0] == FinishRun("completed", CONFIG.rounds)
    f, acts = on_failure(running_state(), "broken")
    assert unannounced_stop(f) == acts[0] == FinishRun("failed", 0, "broken")
    # a state written before the field existed: its stop was said (its orchestrator had no other way)
    old = RunState.model_validate({k: v for k, v in f.model_dump().items() if k != "stop_announced"})
    assert unannounced_stop(old) is None


def test_only_a_failed_or_cancelled_run_with_rounds_left_resumes():
    from populace.orchestrator.workflow import on_resume

    s = running_state()
    assert on_resume(s, PLACEMENT) == (s, [])  # running
    for n in range(1, CONFIG.rounds + 1):
        s, _ = on_result(s, result(n))
    assert s.status == "done" and on_resume(s, PLACEMENT) == (s, [])
    f, _ = on_failure(s, "late")
    assert f is s  # a finished run does not fail


def test_a_resume_before_any_round_restores_nothing_but_a_fork_keeps_its_parent():
    from populace.orchestrator.workflow import fork_run, on_cancel, on_resume, restore_point

    s = new_run("r1", CONFIG, PLACEMENT)
    c, _ = on_cancel(s, "x")
    r, _ = on_resume(c, PLACEMENT)
    assert restore_point(r) is None and r.round == 0 and r.epoch == 1
    parent = running_state()
    for n in (1, 2):
        parent, _ = on_result(parent, result(n))
    f = fork_run("f1", CONFIG, {"h9": [(0, 10)]}, parent, 2, env_ref(2), {"history": [1.0]})
    assert (f.status, f.round, f.restore.run_id, f.restore.round, f.env_state) == (
        "spawning", 2, "r1", 2, env_ref(2))
    _, acts = on_spawned(f, "h9")
    assert acts == [OpenRound(3, 10)]  # a fork plays on from the round after its parent's
    fc, _ = on_cancel(f, "x")
    fr, _ = on_resume(fc, {"h9": [(0, 10)]})
    assert restore_point(fr) == f.restore  # cancelled before its first round: still from its parent


@pytest.mark.parametrize("seed", range(25))
def test_place_ranges_covers_exactly_the_lost_agents_and_keeps_groups_whole(seed):
    from populace.core.placement import place_ranges

    rng = random.Random(seed)
    unit = rng.choice([1, 1, 3, 5])
    agents = rng.randint(1, 400)
    whole = place(agents, [host(f"h{i}", 10_000) for i in range(rng.randint(2, 6))], unit=unit)
    lost = [r for h in rng.sample(sorted(whole), k=max(1, len(whole) // 2)) for r in whole[h]]
    hosts = [host(f"s{i}", rng.randint(400, 900), rng.randint(0, 300)) for i in range(rng.randint(1, 4))]
    out = place_ranges(lost, hosts, unit)
    got = sorted(a for rs in out.values() for f, c in rs for a in range(f, f + c))
    assert got == sorted(a for f, c in lost for a in range(f, f + c))  # each lost agent exactly once
    for rs in out.values():
        for f, c in rs:
            assert f % unit == 0 and ((f + c) % unit == 0 or f + c == agents)  # groups stay whole


# --- budget ---------------------------------------------------------------------------------
def test_a_run_pauses_before_the_round_that_would_go_past_its_budget_and_a_larger_one_resumes_it():
    from populace.core.contracts import Budget, Usage
    from populace.orchestrator.workflow import on_resume, over_budget, resume_refusal

    config = RunConfig(agents=10, rounds=5, budget={"tokens": 2500})
    s = new_run("r1", config, PLACEMENT)
    s, _ = on_spawned(s, "h1")
    s, _ = on_spawned(s, "h2")
    spent = Usage(llm_calls=10, prompt_tokens=900, completion_tokens=100, tokens_sq=1e5)
    s, acts = on_result(s, result(1).model_copy(update={"usage": spent}))
    assert acts == [OpenRound(2, 10)] and s.used.tokens == 1000  # 1000 + 1000 ≤ 2500: round 2 plays
    s, acts = on_result(s, result(2).model_copy(update={"usage": spent}))
    # 2000 used, round 3 needs about 1000 more: it would go past 2500, so the run pauses now
    assert s.status == "paused" and s.round == 2 and s.used.tokens == 2000 and s.last_round == spent
    assert acts == [FinishRun("paused", 2, s.reason)]
    assert "2,000 of 2,500 tokens used" in s.reason and "--budget-tokens" in s.reason
    assert s.env_state == env_ref(2)  # what the next round starts from
    # resuming on the same budget is refused (it would pause again at once); a larger one plays on
    assert "give a larger budget" in resume_refusal(s)
    assert on_resume(s, PLACEMENT) == (s, [])
    r, _ = on_resume(s, PLACEMENT, budget=Budget(tokens=10_000))
    assert r.status == "spawning" and r.config.budget == Budget(tokens=10_000) and r.used.tokens == 2000
    assert over_budget(None, spent, spent) is None
    assert "LLM calls" in over_budget(Budget(llm_calls=15), spent, spent)


def test_usage_adds_up_field_by_field():
    from populace.core.contracts import Usage

    a = Usage(llm_calls=2, prompt_tokens=10, completion_tokens=3, tokens_sq=100.0, infra_retries=1)
    assert a + a == Usage(llm_calls=4, prompt_tokens=20, completion_tokens=6, tokens_sq=200.0, infra_retries=2)
    assert (a + Usage()).tokens == 13
    with pytest.raises(ValueError, match="budget.tokens"):
        RunConfig.model_validate({"budget": {"tokens": 0}})
    with pytest.raises(ValueError, match="budget.dollars"):
        RunConfig.model_validate({"budget": {"dollars": 5}})
