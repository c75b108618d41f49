"""Steering a run that lives on a stack: `populace cancel|resume|follow|fork RUN`. Each checks
the run's state in KV `runs` first, so a command that cannot apply (cancel a finished run,
resume a completed one, fork from a round not played) says why at once instead of waiting."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from populace.cli import display
from populace.client.prepare import PreparedRun
from populace.client.run import RunOutcome, cancel, follow, play, resume
from populace.client.steer import (  # noqa: F401 (SteerError, last_completed, where: this module's API too)
    SteerError,
    cancel_refusal,
    fork_restore,
    known_state,
    last_completed,
    parent_manifest,
    prepare_fork_of,
    resume_refusal,
    where,
)
from populace.core import bus, subjects
from populace.core.contracts import (
    ACTIVE_STATUSES,
    Budget,
    RunDone,
    RunState,
)

ACTIVE = ACTIVE_STATUSES
_state = known_state


async def cancel_run(url: str, rid: str, reason: str, wait_s: float = 30.0) -> tuple[RunState, RunDone | None]:
    """Cancel and wait (up to `wait_s`) for the orchestrator to say the run stopped."""
    nc = await bus.connect_or_fail(url, "populace-cli")
    try:
        state = await _state(nc, rid)
        refusal = cancel_refusal(state)
        if refusal:
            raise SteerError(refusal)
        done: asyncio.Future = asyncio.get_running_loop().create_future()

        async def on_done(msg) -> None:
            if not done.done():
                done.set_result(RunDone.model_validate_json(msg.data))

        sub = await nc.subscribe(subjects.run_done(rid), cb=on_done)
        try:
            await nc.flush()
            await cancel(nc, rid, reason)
            try:
                stopped = await asyncio.wait_for(done, wait_s)
            except TimeoutError:
                stopped = None
        finally:
            await sub.unsubscribe()
        return await _state(nc, rid), stopped
    finally:
        await nc.close()


def raised_budget(state: RunState, tokens: int | None, calls: int | None) -> Budget | None:
    """The run's budget with the limits given on the command line replaced (None: unchanged)."""
    if tokens is None and calls is None:
        return None
    old = state.config.budget or Budget()
    return Budget(tokens=tokens if tokens is not None else old.tokens,
                  llm_calls=calls if calls is not None else old.llm_calls)


async def resume_run(url: str, rid: str, show_progress: bool, budget_tokens: int | None = None,
                     budget_calls: int | None = None) -> tuple[RunState, RunOutcome]:
    nc = await bus.connect_or_fail(url, "populace-cli")
    try:
        state = await _state(nc, rid)
        if why := await resume_refusal(nc, state):
            raise SteerError(why)
        budget = raised_budget(state, budget_tokens, budget_calls)
        with display.RunProgress(state.config, enabled=show_progress) as progress:
            outcome = await resume(nc, rid, on_event=progress.on_event, budget=budget)
        return state, outcome
    finally:
        await nc.close()


async def follow_run(url: str, rid: str, show_progress: bool) -> tuple[RunState, RunOutcome | None]:
    """Follow until recorded; (state, None) when the run already stopped."""
    nc = await bus.connect_or_fail(url, "populace-cli")
    try:
        state = await _state(nc, rid)
        if state.status not in ACTIVE:
            return state, None
        with display.RunProgress(state.config, enabled=show_progress) as progress:
            return state, await follow(nc, rid, on_event=progress.on_event)
    finally:
        await nc.close()


@dataclass
class Fork:
    parent: RunState
    prepared: PreparedRun
    outcome: RunOutcome


async def fork_run(url: str, parent_id: str, after_round: int, changes: dict, show_progress: bool,
                   run_id: str) -> Fork:
    nc = await bus.connect_or_fail(url, "populace-cli")
    try:
        parent, prepared = await prepare_fork_of(nc, parent_id, after_round, changes)
        with display.RunProgress(prepared.config, enabled=show_progress) as progress:
            outcome = await play(nc, prepared.config, run_id=run_id, manifest=prepared.manifest,
                                 on_event=progress.on_event,
                                 fork=fork_restore(parent_id, after_round))
        return Fork(parent, prepared, outcome)
    finally:
        await nc.close()
