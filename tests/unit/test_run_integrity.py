"""What the orchestrator trusts, pure: whose checkpoint digests it records and hands to a
restore, whose faults may stop a run, and whose progress ticks move a round's deadline
(issue 26, items 3 and 4)."""

from __future__ import annotations

import pytest

from populace.core import checkpoints, subjects
from populace.core.contracts import HostInfo, Progress, RoundResult, RunConfig, RunFault, RunState
from populace.orchestrator import workflow
from populace.orchestrator.workflow import (
    RoundTicks,
    fault_refusal,
    fork_digests,
    new_run,
    on_cancel,
    on_hosts_lost,
    on_result,
    on_resume,
    on_spawned,
    restore_point,
)

RID = "r1"
PLACEMENT = {"h1": [(0, 6)], "h2": [(6, 4)]}


def sha(tag: str) -> str:
    return checkpoints.digest(tag.encode())


def claims(round_: int, **extra: dict[str, str]) -> dict[str, dict[str, str]]:
    """What each share's partial reports: the digest of its own range's object."""
    own = {"h1@0": {subjects.checkpoint_agents(RID, round_, 0): sha(f"h1-{round_}")},
           "h2@0": {subjects.checkpoint_agents(RID, round_, 6): sha(f"h2-{round_}")}}
    for key, more in extra.items():
        own.setdefault(key.replace("_", "@"), {}).update(more)
    return own


def result(round_: int, shares=("h1@0", "h2@0"), reported=None) -> RoundResult:
    return RoundResult(run_id=RID, round=round_, n=10, n_valid=10, summary={}, observation={"o": round_},
                       closed_at=0.0, shares=list(shares),
                       checkpoints=claims(round_) if reported is None else reported,
                       env_checkpoint=sha(f"env-{round_}"))


def running() -> RunState:
    s = new_run(RID, RunConfig(agents=10, rounds=5), PLACEMENT, {"h1": 1.0, "h2": 1.0})
    s, _ = on_spawned(s, "h1")
    s, _ = on_spawned(s, "h2")
    return s


def expected(round_: int) -> dict[str, str]:
    return {subjects.checkpoint_env(RID, round_): sha(f"env-{round_}"),
            subjects.checkpoint_agents(RID, round_, 0): sha(f"h1-{round_}"),
            subjects.checkpoint_agents(RID, round_, 6): sha(f"h2-{round_}")}


# --- checkpoints: bound to their writers --------------------------------------------------------
def test_a_closed_round_records_each_shares_digests_and_every_restore_carries_them():
    s, _ = on_result(running(), result(1))
    assert s.checkpoints == expected(1)
    assert restore_point(s).digests == expected(1) and restore_point(s).round == 1
    s, _ = on_result(s, result(2))
    assert s.checkpoints == expected(2)  # only the last completed round's: the state stays small
    # a lost host's replacement restores from round 2, with round 2's digests
    lost, _ = on_hosts_lost(s, [HostInfo(host_id="h1", capacity=100, agents=6, pid=1, started_at=1.0,
                                         heartbeat_at=0.0)], {"h1"}, 30.0)
    assert restore_point(lost).digests == expected(2)
    # a resume too
    cancelled, _ = on_cancel(s, "x")
    resumed, _ = on_resume(cancelled, {"h3": [(0, 10)]})
    assert restore_point(resumed).digests == expected(2) and restore_point(resumed).round == 2


def test_a_share_cannot_vouch_for_another_shares_checkpoint():
    """Issue 26, 3: host h2 reports a digest of h1's object (which it rewrote): the claim is
    dropped, h1's own stays, and a claim of an object nobody plays is dropped too."""
    forged = claims(1, h2_0={subjects.checkpoint_agents(RID, 1, 0): sha("forged"),
                             subjects.checkpoint_agents(RID, 1, 100): sha("nobody")})
    digests, dropped = checkpoints.recorded(RID, 1, forged, sha("env-1"), {"h1@0": [(0, 6)], "h2@0": [(6, 4)]})
    assert digests == expected(1)
    assert dropped == [f"share h2@0 reported a digest of {RID}.1.agents.0, which is not one of its ranges' objects",
                       f"share h2@0 reported a digest of {RID}.1.agents.100, which is not one of its ranges' objects"]
    # the same in the workflow: the state records h1's own digest, never h2's claim of it
    s, _ = on_result(running(), result(1, reported=forged))
    assert s.checkpoints == expected(1)
    # h2 alone claims h1's object: no digest is recorded for it, so nobody will ever read it
    only_h2 = {"h2@0": {subjects.checkpoint_agents(RID, 1, 0): sha("forged")}}
    s, _ = on_result(running(), result(1, reported=only_h2))
    assert subjects.checkpoint_agents(RID, 1, 0) not in s.checkpoints


def test_a_fork_from_an_older_round_takes_its_digests_from_that_rounds_result():
    s = running()
    for n in (1, 2, 3):
        s, _ = on_result(s, result(n))
    assert fork_digests(s, 3, None) == expected(3)  # the last completed round: from the state
    assert fork_digests(s, 1, result(1)) == expected(1)  # an older one: from its result, own ranges only
    forged = result(1, reported=claims(1, h2_0={subjects.checkpoint_agents(RID, 1, 0): sha("forged")}))
    assert fork_digests(s, 1, forged) == expected(1)
    with pytest.raises(checkpoints.CheckpointUnverified, match="round 1 result is no longer in the stream"):
        fork_digests(s, 1, None)
    with pytest.raises(checkpoints.CheckpointUnverified, match="not the one the run counted"):
        fork_digests(s, 1, result(1, shares=("h1@0", "h9@0")))
    f = workflow.fork_run("f1", s.config, {"h9": [(0, 10)]}, s, 1, workflow.state_ref(RID, 1, sha("env-1")), {},
                          digests=expected(1))
    assert restore_point(f).digests == expected(1) and restore_point(f).run_id == RID


def test_the_layout_remembers_which_share_played_which_ranges():
    s, _ = on_result(running(), result(1))
    lost, _ = on_hosts_lost(s, [HostInfo(host_id="h1", capacity=100, agents=6, pid=1, started_at=1.0,
                                         heartbeat_at=0.0)], {"h1"}, 30.0)
    assert workflow.owners(lost, 1) == {"h1@0": [(0, 6)], "h2@0": [(6, 4)]}
    assert workflow.owners(lost, 2) == {"h1@0": [(0, 6)], "h1@1": [(6, 4)]}


# --- faults: only from the run's placed shares and its entitled services --------------------------
def fault(source: str, pause: bool = False, epoch: int | None = None, run_id: str = RID) -> RunFault:
    return RunFault(run_id=run_id, source=source, reason="forged", pause=pause, epoch=epoch)


@pytest.mark.parametrize(("source", "subject_of", "epoch", "refused"), [
    ("h1", "h1", 0, None),  # a placed share
    ("h1", "h1", None, None),  # a placed host (no epoch named)
    ("environment", "environment", None, None),  # the environment
    ("host-9", "host-9", None, "agent-host host-9 plays no share of run r1 (epoch 0)"),  # placed in no run
    ("host-9", "host-9", 0, "share host-9@0 is not in run r1's placement"),
    ("h1", "h1", 3, "share h1@3 is not in run r1's placement"),  # an epoch never placed
    ("h1", "host-9", None, "a fault from host-9 on run.r1.fault.host-9 claims to come from 'h1'"),  # another sender
    ("environment", "host-9", None, "claims to come from 'environment'"),
    ("recorder", "recorder", None, None),  # the recorder, pausing a run whose events its full disk cannot store
    ("gateway", "gateway", None, "agent-host gateway plays no share"),  # no other service
    ("recorder", "host-9", None, "claims to come from 'recorder'"),
])
def test_a_fault_stops_a_run_only_from_its_placed_shares_or_its_entitled_services(source, subject_of, epoch, refused):
    """Issue 26, 4: one well-formed fault from a host placed in no run failed the run. The
    recorder's disk-full pause was refused as a host's once the environment alone was entitled."""
    why = fault_refusal(running(), fault(source, epoch=epoch), subjects.run_fault(RID, subject_of))
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why, why


def test_a_fault_about_an_unknown_run_is_refused():
    assert fault_refusal(None, fault("h1"), subjects.run_fault(RID, "h1")) == "run r1 is not known"


# --- progress: only real progress of the round in play moves its deadline --------------------------
def tick(host: str, answered: int, round_: int = 1) -> tuple[str, Progress]:
    return subjects.progress(RID, round_, host), Progress(run_id=RID, round=round_, host_id=host, answered=answered)


def test_progress_counts_only_from_placed_hosts_for_the_round_in_play_within_their_agents():
    ticks = RoundTicks.of(running())
    assert (ticks.round, ticks.epoch, ticks.room) == (1, 0, {"h1": 6, "h2": 4})
    assert ticks.take(*tick("h1", 0)) is True  # a gateway works on its prompts
    assert ticks.take(*tick("h1", 4)) is True
    assert ticks.take(*tick("h1", 2)) is True
    assert ticks.take(*tick("h1", 0)) is False  # all its agents answered: nothing left to wait for
    assert ticks.take(*tick("h1", 1)) == "agent-host h1 would have answered 7 agents in round 1 of run r1; it plays 6"
    # spoofed: a host placed in no run, another host's name in the body, a round not in play
    assert ticks.take(*tick("host-9", 1)) == "agent-host host-9 plays no share of run r1 (epoch 0)"
    assert ticks.take(*tick("host-9", 0)) == "agent-host host-9 plays no share of run r1 (epoch 0)"
    _, body = tick("h2", 1)
    assert "claims host h2" in ticks.take(subjects.progress(RID, 1, "host-9"), body)
    assert ticks.take(*tick("h2", 1, round_=2)) == "round 2 of run r1 is not in play (round 1 is)"
    assert ticks.answered == {"h1": 6}
    s, _ = on_result(running(), result(1))
    later = RoundTicks.of(s)
    assert later.round == 2 and later.take(*tick("h2", 4, round_=1)) is False  # a straggler of round 1
