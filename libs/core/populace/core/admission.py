"""What a run's state admits: pure checks of an announcement against the run state the
orchestrator wrote (KV `runs`) before it announced. A forged or corrupted round open (a
later round, another placement, another observation) is refused by whoever receives it, so
it can neither stall a run nor make hosts play a round nobody opened."""

from __future__ import annotations

from populace.core.contracts import RoundOpen, RunHead, RunState


def open_refusal(state: RunState | RunHead | None, opened: RoundOpen) -> str | None:
    """Why `opened` is not an announcement of `state`'s run (None: it is, or it is an older
    one, which receivers drop on their own). `stale`: the state may lag the announcement (a
    KV replica behind its leader): then the caller reads it again before refusing."""
    if state is None:
        return f"run {opened.run_id} is not known"
    if opened.epoch > state.epoch or (opened.epoch == state.epoch and opened.round > state.round):
        return (f"round {opened.round} (epoch {opened.epoch}) is not open in run {opened.run_id}: "
                f"its state is at round {state.round}, epoch {state.epoch}")
    if opened.epoch < state.epoch or opened.round < state.round:
        return None  # an older announcement: receivers know it is past
    if state.status != "running":
        return f"run {opened.run_id} is {state.status}, not running"
    shares = {sh.key: sh.count for sh in state.shares}
    for what, mine, theirs in (("shares", opened.shares, shares), ("config", opened.config_ref, state.config_ref),
                               ("observation", opened.observation, state.observation),
                               ("env_state", opened.env_state, state.env_state),
                               ("prototypes", opened.prototypes, state.prototypes),
                               ("population", opened.population, state.population)):
        if mine != theirs:
            return f"round {opened.round} of run {opened.run_id}: its {what} is not the run's"
    return None


def may_lag(state: RunState | RunHead | None, opened: RoundOpen) -> bool:
    """Whether the state read may simply be older than the announcement (read it again)."""
    return state is None or (opened.epoch, opened.round) > (state.epoch, state.round) or (
        (opened.epoch, opened.round) == (state.epoch, state.round) and state.status == "spawning")
