"""Runs on a stack, by its NATS URL: a private stack's processes, playing a prepared run, and
steering a run that lives on a stack (`populace run|demo|cancel|resume|follow|fork`). Each
steering call checks the run's state in KV `runs` first, so one that cannot apply (cancel a
finished run, resume a completed one, fork from a round not played) says why at once instead
of waiting. Progress bars go to stderr (`show_progress`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from populace.client.model_checks import fleet_refusal
from populace.client.prepare import PreparedRun
from populace.client.progress import RunProgress
from populace.client.run import RunOutcome, cancel, follow, new_run_id, play, recorded_event, resume
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
    ModelEndpoint,
    RunDone,
    RunRecorded,
    RunState,
    gateway_bindings,
)
from populace.core.scenario import ScenarioError

ACTIVE = ACTIVE_STATUSES
_state = known_state

# vLLM's CPU build takes 60-80 s to start here (one replica on 2 cores), longer when several share the cores.
VLLM_START_TIMEOUT_S = 900.0
# The backends a private stack starts replicas for (dummy needs none; openai's are registered by the user).
REPLICA_BACKENDS = frozenset({"local", "sim", "vllm"})


# How a private stack starts the replicas of a run model that names no URL, by its kind.
MODEL_REPLICAS = {"llamacpp": ("local", ["replicas", "local"]), "vllm": ("vllm", ["replicas", "vllm", "--cpu"]),
                  "sim": ("sim", ["replicas", "sim"])}


def model_backends(models: Sequence[ModelEndpoint]) -> set[str]:
    """The replica backends a private stack starts for a run's models (what needs preparing first:
    llama.cpp, vLLM's CPU build)."""
    return {MODEL_REPLICAS[m.kind][0] for m in models if m.base_url is None and m.kind in MODEL_REPLICAS}


def private_stack(backends: set[str] | frozenset[str], replicas: int, hosts: int, db: str,
                  models: Sequence[ModelEndpoint] = ()):
    """An unstarted private stack (embedded NATS, every service) with `replicas` LLM replicas per
    local/sim/vllm backend used, and per run model (`models:`) that names no URL, registered for
    it (a keyed one asks for its key, read from the same variable); its gateway may send each
    model's key only to that model's host (POPULACE_GATEWAY_KEYS, populace.gateway.keys).
    `ready_timeout(backends)` is how long it may take to be ready."""
    from populace.client.stack import Stack

    extra = {f"replicas-{b}": ["replicas", b, *(["--cpu"] if b == "vllm" else []), "--count", str(replicas)]
             for b in sorted(set(backends) & REPLICA_BACKENDS)} if not models else {}
    for m in models:
        if m.base_url is None and m.kind in MODEL_REPLICAS:
            keyed = ["--api-key-env", m.api_key_env] if m.api_key_env else []
            extra[f"replicas-{m.name}"] = [*MODEL_REPLICAS[m.kind][1], "--count", str(replicas), "--serves", m.name,
                                           *keyed]
    keys, model_hosts = gateway_bindings(list(models))
    env = {"POPULACE_GATEWAY_KEYS": keys, "POPULACE_GATEWAY_MODEL_HOSTS": model_hosts} if models else {}
    secrets = tuple(m.api_key_env for m in models if m.api_key_env)
    return Stack(hosts=hosts, db=db, extra=extra, replicas=replicas * len(extra), env=env, secrets=secrets)


class StoreInUse(RuntimeError):
    """Another `populace up` holds the JetStream store directory (the message names it and the holder)."""


def lock_store(store: Path):
    """Hold `store` for this process: nats-server takes no lock of its own, and two servers on
    one store directory corrupt it. Returns the open lock file (closing it releases the lock)."""
    import fcntl

    store.mkdir(parents=True, exist_ok=True)
    lock = open(store / "populace-up.lock", "a+")  # noqa: SIM115 - held until the stack stops
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise StoreInUse(f"--store: {store} is in use by another `populace up` ({holder}); stop it, or give this "
                         "one its own --store DIR") from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()}\n")
    lock.flush()
    return lock


@contextlib.contextmanager
def served_stack(hosts: int, port: int, db: str, store: Path | None):
    """`populace up`: embedded NATS on `port` with its JetStream store in `store` (locked; kept
    at stop, so runs can be resumed and forked after a restart; None: a temporary one) and every
    service; yields (stack, nats server) once started, and stops both on the way out, even when
    interrupted. Raises StoreInUse before starting anything."""
    from populace.client.stack import Stack
    from populace.core.natsserver import EmbeddedNats
    from populace.core.processes import uninterrupted

    lock = None if store is None else lock_store(store)
    nats = EmbeddedNats(port=port, store_dir=None if store is None else str(store.resolve()))
    stack = Stack(hosts=hosts, db=db)
    try:
        nats.log_file = None
        nats.start()
        stack.nats_url = nats.url
        stack.start()
        yield stack, nats
    finally:
        with uninterrupted():
            try:
                stack.stop()
            finally:
                nats.stop()
                if lock is not None:
                    lock.close()


def ready_timeout(backends: set[str] | frozenset[str]) -> float:
    return VLLM_START_TIMEOUT_S if "vllm" in backends else 60.0


async def play_prepared(url: str, prepared: PreparedRun, show_progress: bool, run_id: str | None = None,
                        on_start=None, client_name: str = "populace-cli") -> RunOutcome:
    """Submit a prepared run to the stack at `url` and follow it until it is recorded;
    `on_start(run_id)` as soon as its id is known (a long run can be followed, cancelled or
    looked up from another terminal at once)."""
    nc = await bus.connect_or_fail(url, client_name)
    try:
        if prepared.config.models and (why := await fleet_refusal(nc, prepared.config.models)):
            raise ScenarioError(why)  # before the run: a model nobody serves would only pause it
    except BaseException:
        await nc.close()
        raise
    run_id = run_id or new_run_id()
    if on_start is not None:
        on_start(run_id)
    try:
        with RunProgress(prepared.config, enabled=show_progress) as progress:
            return await play(nc, prepared.config, run_id=run_id, personas=prepared.personas,
                              graph=prepared.graph_blobs, manifest=prepared.manifest, on_event=progress.on_event)
    finally:
        await nc.close()


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


def raised_budget(state: RunState, tokens: int | None, calls: int | None,
                  dollars: float | None = None) -> Budget | None:
    """The run's budget with the limits given on the command line replaced (None: unchanged).
    SteerError when a dollar budget is given to a run whose models have no prices."""
    if tokens is None and calls is None and dollars is None:
        return None
    if dollars is not None and not any(not m.prices.free for m in state.config.models):
        raise SteerError(f"--budget-dollars: run {state.run_id}'s models have no prices (`models:` with `prices:`), "
                         "so it spends no dollars; give --budget-tokens or --budget-calls")
    old = state.config.budget or Budget()
    return Budget(tokens=tokens if tokens is not None else old.tokens,
                  llm_calls=calls if calls is not None else old.llm_calls,
                  dollars=dollars if dollars is not None else old.dollars)


async def resume_run(url: str, rid: str, show_progress: bool, budget_tokens: int | None = None,
                     budget_calls: int | None = None, budget_dollars: float | None = None,
                     ) -> tuple[RunState, RunOutcome]:
    nc = await bus.connect_or_fail(url, "populace-cli")
    try:
        state = await _state(nc, rid)
        if why := await resume_refusal(nc, state):
            raise SteerError(why)
        budget = raised_budget(state, budget_tokens, budget_calls, budget_dollars)
        with RunProgress(state.config, enabled=show_progress, spent=state.used + state.interviews,
                         rounds_done=last_completed(state)) as progress:
            outcome = await resume(nc, rid, on_event=progress.on_event, budget=budget)
        return state, outcome
    finally:
        await nc.close()


async def follow_run(url: str, rid: str, show_progress: bool
                     ) -> tuple[RunState, RunOutcome | None, RunRecorded | None]:
    """Follow until recorded; (state, None, its RunRecorded if any) when the run already stopped."""
    nc = await bus.connect_or_fail(url, "populace-cli")
    try:
        state = await _state(nc, rid)
        if state.status not in ACTIVE:
            return state, None, await recorded_event(nc, rid)
        with RunProgress(state.config, enabled=show_progress, spent=state.used + state.interviews,
                         rounds_done=last_completed(state)) as progress:
            return state, await follow(nc, rid, on_event=progress.on_event), None
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
        with RunProgress(prepared.config, enabled=show_progress) as progress:
            outcome = await play(nc, prepared.config, run_id=run_id, manifest=prepared.manifest,
                                 on_event=progress.on_event,
                                 fork=fork_restore(parent_id, after_round))
        return Fork(parent, prepared, outcome)
    finally:
        await nc.close()
