"""What steering a run checks before it asks anything of the stack, shared by the CLI
(`populace cancel|resume|fork`, populace.client.live) and the manager's run page, so both refuse the
same things with the same words.

    cancel_refusal(state)                   # None, or why `populace cancel` would refuse
    await resume_refusal(nc, state)         # None, or why `populace resume` would refuse
    changes = overrides(["game.ratio=1/2"])  # `--set` pairs → a nested mapping (OverrideError)
    parent, prepared = await prepare_fork_of(nc, "run-1", 2, changes)   # SteerError: why not
    await submit_fork(nc, "run-1", 2, prepared, run_id)                 # published, not followed
"""

from __future__ import annotations

from collections.abc import Iterable

from nats.aio.client import Client
from nats.js.errors import NotFoundError

from populace.client.prepare import PreparedRun, prepare_fork
from populace.client.run import run_state, submit
from populace.core import bus, subjects
from populace.core.contracts import (
    ACTIVE_STATUSES,
    RESUMABLE_STATUSES,
    HostInfo,
    Restore,
    RunStarted,
    RunState,
)
from populace.core.scenario import ScenarioError


class SteerError(RuntimeError):
    """The run cannot be steered that way (the message says why)."""


class OverrideError(ValueError):
    """A `--set KEY=VALUE` pair that is not one (the message says which)."""


def last_completed(state: RunState) -> int:
    """The last round whose result is in: while running, `round` is the one in play."""
    return max(0, state.round - 1) if state.status == "running" else state.round


def where(state: RunState) -> str:
    return f"{last_completed(state)} of {state.config.rounds} rounds completed"


def cancel_refusal(state: RunState) -> str | None:
    """Why the run cannot be cancelled now (None: it is spawning or running)."""
    if state.status in ACTIVE_STATUSES:
        return None
    return f"run {state.run_id} is {state.status} ({where(state)}): nothing to cancel"


async def hosts_up(nc: Client) -> int:
    """Agent-hosts registered on the stack (fresh entries of KV `hosts`)."""
    from populace.core.settings import Settings

    hosts = await bus.registry_entries(nc.jetstream(), subjects.HOSTS_BUCKET, HostInfo,
                                       fresh_within_s=Settings().registry_ttl_s)
    return len(hosts)


async def resume_refusal(nc: Client, state: RunState, start_hosts: str = "`populace up`") -> str | None:
    """Why `populace resume` would refuse the run now (None: it may resume). `start_hosts`: how
    the reader starts an agent-host (the CLI's command, the manager's page)."""
    rid = state.run_id
    if state.status not in RESUMABLE_STATUSES:
        hint = " (`populace follow` shows it)" if state.status in ACTIVE_STATUSES else ""
        return f"run {rid} is {state.status}{hint}: only a failed, cancelled or paused run resumes"
    if state.round >= state.config.rounds:
        return (f"run {rid} has played all {state.config.rounds} rounds: nothing to resume "
                f"(`populace fork {rid} --from-round {state.round} --set rounds=N` plays more)")
    if not await hosts_up(nc):
        return f"no agent-host is up on this stack: start one ({start_hosts}), then resume"
    return None


def overrides(pairs: Iterable[str] | None) -> dict:
    """`game.ratio=1/2`, `rounds=5` → a nested mapping (values read as YAML scalars, within
    populace.core.yamlload's limits)."""
    import yaml

    from populace.core import yamlload

    out: dict = {}
    for pair in pairs or []:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise OverrideError(f"--set: {yamlload.short_repr(pair)} is not KEY=VALUE (e.g. --set game.ratio=1/2)")
        try:
            value = yamlload.load(text) if text.strip() else ""
        except yamlload.YamlLimitError as err:
            raise OverrideError(f"--set {key.strip()}: {err}") from None
        except yaml.YAMLError:
            value = text
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise OverrideError(f"--set: {key} sets inside a value that is not a mapping")
        node[parts[-1]] = value
    return out


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


async def known_state(nc: Client, rid: str) -> RunState:
    state = await run_state(nc, rid)
    if state is None:
        raise SteerError(f"run {rid!r} is not known on this stack (KV '{subjects.RUNS_BUCKET}')")
    return state


async def prepare_fork_of(nc: Client, parent_id: str, after_round: int, changes: dict) -> tuple[RunState, PreparedRun]:
    """The parent's state and the fork's checked config and manifest; SteerError says why a
    fork cannot start there (a round not completed, a change its simulation refuses, too few
    rounds left). A message about the round starts with `--from-round:`."""
    parent = await known_state(nc, parent_id)
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
    return parent, prepared


def fork_restore(parent_id: str, after_round: int) -> Restore:
    return Restore(run_id=parent_id, round=after_round)


async def submit_fork(nc: Client, parent_id: str, after_round: int, prepared: PreparedRun, run_id: str) -> str:
    """Publish the fork's start without following it (the manager); `populace fork` plays it."""
    return await submit(nc, prepared.config, run_id=run_id, manifest=prepared.manifest,
                        fork=fork_restore(parent_id, after_round))
