"""Steering a run that lives on a stack: `populace cancel|resume|follow|fork RUN`. Each checks
the run's state in KV `runs` first, so a command that cannot apply (cancel a finished run,
resume a completed one, fork from a round not played) says why at once instead of waiting."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from nats.js.errors import NotFoundError

from populace.cli import display
from populace.client.prepare import PreparedRun, prepare_fork
from populace.client.run import RunOutcome, cancel, follow, play, resume, run_state
from populace.core import bus, subjects
from populace.core.contracts import (
    ACTIVE_STATUSES,
    RESUMABLE_STATUSES,
    Budget,
    HostInfo,
    Restore,
    RunDone,
    RunStarted,
    RunState,
)
from populace.core.scenario import ScenarioError

ACTIVE = ACTIVE_STATUSES
RESUMABLE = RESUMABLE_STATUSES


class SteerError(RuntimeError):
    """The run cannot be steered that way (the message says why)."""


def last_completed(state: RunState) -> int:
    """The last round whose result is in: while running, `round` is the one in play."""
    return max(0, state.round - 1) if state.status == "running" else state.round


def where(state: RunState) -> str:
    done = last_completed(state)
    return f"{done} of {state.config.rounds} rounds completed"


async def _state(nc, rid: str) -> RunState:
    state = await run_state(nc, rid)
    if state is None:
        raise SteerError(f"run {rid!r} is not known on this stack (KV '{subjects.RUNS_BUCKET}')")
    return state


async def cancel_run(url: str, rid: str, reason: str, wait_s: float = 30.0) -> tuple[RunState, RunDone | None]:
    """Cancel and wait (up to `wait_s`) for the orchestrator to say the run stopped."""
    nc = await bus.connect_or_fail(url, "populace-cli")
    try:
        state = await _state(nc, rid)
        if state.status not in ACTIVE:
            raise SteerError(f"run {rid} is {state.status} ({where(state)}): nothing to cancel")
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


async def _hosts_up(nc) -> int:
    from populace.core.settings import Settings

    hosts = await bus.registry_entries(nc.jetstream(), subjects.HOSTS_BUCKET, HostInfo,
                                       fresh_within_s=Settings().registry_ttl_s)
    return len(hosts)


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
        if state.status not in RESUMABLE:
            hint = " (`populace follow` shows it)" if state.status in ACTIVE else ""
            raise SteerError(f"run {rid} is {state.status}{hint}: only a failed, cancelled or paused run resumes")
        if state.round >= state.config.rounds:
            raise SteerError(f"run {rid} has played all {state.config.rounds} rounds: nothing to resume "
                             f"(`populace fork {rid} --from-round {state.round} --set rounds=N` plays more)")
        if not await _hosts_up(nc):
            raise SteerError("no agent-host is up on this stack: start one (`populace up`), then resume")
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


async def parent_manifest(js, rid: str) -> dict | None:
    """The manifest the run started with (its RunStarted event, while the stream holds it)."""
    try:
        msg = await js.get_last_msg(subjects.RUN_STREAM, subjects.run_started(rid))
    except NotFoundError:
        return None
    try:
        return RunStarted.model_validate_json(msg.data).manifest
    except ValueError:
        return None


@dataclass
class Fork:
    parent: RunState
    prepared: PreparedRun
    outcome: RunOutcome


async def fork_run(url: str, parent_id: str, after_round: int, changes: dict, show_progress: bool,
                   run_id: str) -> Fork:
    nc = await bus.connect_or_fail(url, "populace-cli")
    try:
        parent = await _state(nc, parent_id)
        done = last_completed(parent)
        if after_round > done:
            raise SteerError(f"--from-round: run {parent_id} has completed {done} round(s); "
                             f"fork from 1..{done}" if done else
                             f"--from-round: run {parent_id} has not completed a round yet")
        try:
            prepared = prepare_fork(parent.config, after_round, changes,
                                    await parent_manifest(nc.jetstream(), parent_id), parent_id)
        except ScenarioError as err:
            raise SteerError(str(err)) from None
        if prepared.config.rounds <= after_round:
            raise SteerError(f"rounds: the fork continues after round {after_round}, so it needs more "
                             f"than {after_round} rounds (--set rounds=N)")
        with display.RunProgress(prepared.config, enabled=show_progress) as progress:
            outcome = await play(nc, prepared.config, run_id=run_id, manifest=prepared.manifest,
                                 on_event=progress.on_event,
                                 fork=Restore(run_id=parent_id, round=after_round))
        return Fork(parent, prepared, outcome)
    finally:
        await nc.close()
