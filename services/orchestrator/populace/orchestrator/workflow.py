"""Run workflow, pure (deciding, not doing): given the run state and an event, return the
next state and the actions to take. The service performs the actions after the new state
is stored by compare-and-swap, so a replayed event never opens a round twice."""

from __future__ import annotations

import time
from dataclasses import dataclass

from populace.core.contracts import RoundResult, RunConfig, RunState


@dataclass(frozen=True)
class OpenRound:
    """Open `round`; its observation and the environment's state are the new run state's."""

    round: int
    expected: int


@dataclass(frozen=True)
class FinishRun:
    status: str  # "completed" | "failed"
    rounds: int
    reason: str | None = None


Action = OpenRound | FinishRun


def new_run(run_id: str, config: RunConfig, placement: dict[str, list[tuple[int, int]]]) -> RunState:
    return RunState(run_id=run_id, status="spawning", config=config, placement=placement)


def on_spawned(state: RunState, host_id: str) -> tuple[RunState, list[Action]]:
    if state.status != "spawning" or host_id in state.spawned or host_id not in state.placement:
        return state, []
    spawned = [*state.spawned, host_id]
    if len(spawned) < len(state.placement):
        return state.model_copy(update={"spawned": spawned, "updated_at": time.time()}), []
    nxt = state.model_copy(update={"spawned": spawned, "status": "running", "round": 1,
                                   "updated_at": time.time()})
    return nxt, [OpenRound(1, state.config.agents)]


def on_result(state: RunState, result: RoundResult) -> tuple[RunState, list[Action]]:
    if state.status != "running" or result.round != state.round:
        return state, []  # stale or replayed result
    carried = {"env_state": result.state, "observation": result.observation, "updated_at": time.time()}
    if state.round >= state.config.rounds:
        done = state.model_copy(update={"status": "done", **carried})
        return done, [FinishRun("completed", state.round)]
    n = state.round + 1
    nxt = state.model_copy(update={"round": n, **carried})
    return nxt, [OpenRound(n, state.config.agents)]


def on_failure(state: RunState, reason: str) -> tuple[RunState, list[Action]]:
    if state.status in ("done", "failed"):
        return state, []
    failed = state.model_copy(update={"status": "failed", "reason": reason, "updated_at": time.time()})
    return failed, [FinishRun("failed", state.round, reason)]


def lost_hosts(state: RunState, live: set[str]) -> list[str]:
    """Hosts the run placed agents on that no longer heartbeat, while the run needs them."""
    if state.status not in ("spawning", "running"):
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
                             f"{silent_s:g}s); its {agents} agents cannot answer")
