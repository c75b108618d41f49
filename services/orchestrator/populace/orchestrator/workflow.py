"""Run workflow, pure (deciding, not doing): given the run state and an event, return the
next state and the actions to take. The service performs the actions after the new state
is stored by compare-and-swap, so a replayed event never opens a round twice.

A run plays in epochs: a resume starts a new one (new placement, agents restored from the
last completed round's checkpoint), and events of an older epoch are stale."""

from __future__ import annotations

import time
from dataclasses import dataclass

from populace.core.contracts import Layout, Restore, RoundResult, RunConfig, RunState

Placement = dict[str, list[tuple[int, int]]]
ACTIVE = ("spawning", "running")
RESUMABLE = ("failed", "cancelled")


@dataclass(frozen=True)
class OpenRound:
    """Open `round`; its observation and the environment's state are the new run state's."""

    round: int
    expected: int


@dataclass(frozen=True)
class FinishRun:
    status: str  # "completed" | "failed" | "cancelled"
    rounds: int
    reason: str | None = None


@dataclass(frozen=True)
class SpawnAgents:
    """Spawn the new state's placement (a resume: announce it first, then spawn)."""

    resumed: bool = False


Action = OpenRound | FinishRun | SpawnAgents


def layout_of(placement: Placement) -> list[tuple[int, int]]:
    return sorted(r for ranges in placement.values() for r in ranges)


def layout_for(state: RunState, round_: int) -> list[tuple[int, int]]:
    """The ranges the run's hosts played (and checkpointed) `round_` in."""
    chosen = [l for l in state.layouts if l.from_round <= round_]
    return chosen[-1].ranges if chosen else layout_of(state.placement)


def new_run(run_id: str, config: RunConfig, placement: Placement) -> RunState:
    return RunState(run_id=run_id, status="spawning", config=config, placement=placement,
                    layouts=[Layout(from_round=1, ranges=layout_of(placement))])


def fork_run(run_id: str, config: RunConfig, placement: Placement, parent: RunState, after_round: int,
             env_state: dict, observation: dict) -> RunState:
    """A new run that starts where `parent` was after `after_round` (its agents' and
    environment's state), with its own config (the intervention)."""
    return RunState(run_id=run_id, status="spawning", config=config, placement=placement, round=after_round,
                    restore=Restore(run_id=parent.run_id, round=after_round,
                                    ranges=layout_for(parent, after_round)),
                    layouts=[Layout(from_round=after_round + 1, ranges=layout_of(placement))],
                    env_state=env_state, observation=observation)


def on_spawned(state: RunState, host_id: str, epoch: int = 0) -> tuple[RunState, list[Action]]:
    if (state.status != "spawning" or epoch != state.epoch or host_id in state.spawned
            or host_id not in state.placement):
        return state, []
    spawned = [*state.spawned, host_id]
    if len(spawned) < len(state.placement):
        return state.model_copy(update={"spawned": spawned, "updated_at": time.time()}), []
    n = state.round + 1  # while spawning, `round` is the last completed one
    nxt = state.model_copy(update={"spawned": spawned, "status": "running", "round": n,
                                   "updated_at": time.time()})
    return nxt, [OpenRound(n, state.config.agents)]


def on_result(state: RunState, result: RoundResult) -> tuple[RunState, list[Action]]:
    if state.status != "running" or result.round != state.round or result.epoch != state.epoch:
        return state, []  # stale or replayed result
    carried = {"env_state": result.state, "observation": result.observation, "updated_at": time.time()}
    if state.round >= state.config.rounds:
        done = state.model_copy(update={"status": "done", **carried})
        return done, [FinishRun("completed", state.round)]
    n = state.round + 1
    nxt = state.model_copy(update={"round": n, **carried})
    return nxt, [OpenRound(n, state.config.agents)]


def completed(state: RunState) -> int:
    """The last round whose result is in (so whose checkpoint is complete)."""
    if state.status == "done":
        return state.round
    if state.status == "spawning":
        return state.round
    return max(0, state.round - 1)


def on_failure(state: RunState, reason: str) -> tuple[RunState, list[Action]]:
    if state.status not in ACTIVE:
        return state, []
    failed = state.model_copy(update={"status": "failed", "round": completed(state), "reason": reason,
                                      "updated_at": time.time()})
    return failed, [FinishRun("failed", failed.round, reason)]


def on_cancel(state: RunState, reason: str) -> tuple[RunState, list[Action]]:
    """Stop at once; the round in play is dropped (it is played again on resume)."""
    if state.status not in ACTIVE:
        return state, []
    cancelled = state.model_copy(update={"status": "cancelled", "round": completed(state), "reason": reason,
                                         "updated_at": time.time()})
    return cancelled, [FinishRun("cancelled", cancelled.round, reason)]


def on_resume(state: RunState, placement: Placement) -> tuple[RunState, list[Action]]:
    """A failed or cancelled run continues after its last completed round, in a new epoch,
    on `placement` (whatever hosts are up now); its agents are restored from the checkpoint."""
    if state.status not in RESUMABLE or state.round >= state.config.rounds:
        return state, []
    after = state.round  # failed/cancelled runs keep their last completed round here
    if state.restore is not None and after <= state.restore.round:
        restore = state.restore  # no round completed since it was restored (a fork's parent, say)
    elif after:
        restore = Restore(run_id=state.run_id, round=after, ranges=layout_for(state, after))
    else:
        restore = None  # nothing played yet: a fresh start
    resumed = state.model_copy(update={
        "status": "spawning", "placement": placement, "spawned": [], "epoch": state.epoch + 1,
        "restore": restore, "reason": None, "updated_at": time.time(),
        "layouts": [*state.layouts, Layout(from_round=after + 1, ranges=layout_of(placement))],
    })
    return resumed, [SpawnAgents(resumed=True)]


def lost_hosts(state: RunState, live: set[str]) -> list[str]:
    """Hosts the run placed agents on that no longer heartbeat, while the run needs them."""
    if state.status not in ACTIVE:
        return []
    return sorted(h for h in state.placement if h not in live)


def on_hosts_lost(state: RunState, live: set[str], silent_s: float) -> tuple[RunState, list[Action]]:
    """A host that stopped heartbeating takes its agents' answers with it: fail the run with a
    reason that says which host and when, rather than wait for a round that cannot close."""
    lost = lost_hosts(state, live)
    if not lost:
        return state, []
    where = f"round {state.round}" if state.status == "running" else "spawning"
    agents = sum(c for h in lost for _, c in state.placement[h])
    return on_failure(state, f"agent-host {', '.join(lost)} stopped during {where} (no heartbeat for "
                             f"{silent_s:g}s); its {agents} agents cannot answer; "
                             f"`populace resume {state.run_id}` continues it")
