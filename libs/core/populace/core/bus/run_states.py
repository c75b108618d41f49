"""A run's state in KV `runs` as a service reads it: whole (its config validated once per
process), without its config, and whether a round open is the run's."""

from __future__ import annotations

import asyncio
import time

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError

from populace.core import admission, runconfig_cache, subjects
from populace.core.bus.retries import until_ready
from populace.core.contracts import RoundOpen, RunHead, RunState, RunWriters

# How long a receiver waits for KV `runs` to catch up with an announcement it got first (a KV
# read from a replica behind its leader), before it refuses the announcement.
STATE_LAG_S = 2.0


async def _stored(js: JetStreamContext, run_id: str) -> bytes | None:
    """The run's entry in KV `runs` (None: none), read again through what is transient: a
    round open read while the bucket's leader is being elected (a NATS node lost) timed out,
    and a host that dropped that open never played the round (the run stalled)."""
    async def read() -> bytes | None:
        kv = await js.key_value(subjects.RUNS_BUCKET)
        try:
            return (await kv.get(run_id)).value
        except KeyNotFoundError:
            return None
    return await until_ready(read, f"run {run_id}'s state")


async def run_state(js: JetStreamContext, run_id: str) -> RunState | None:
    """The run's state in KV `runs` (None: not a run of this stack)."""
    raw = await _stored(js, run_id)
    return None if raw is None else runconfig_cache.CACHE.state(raw)  # its config validated once per process


async def run_head(js: JetStreamContext, run_id: str) -> RunHead | None:
    """The run's state in KV `runs` without its config (None: not a run of this stack)."""
    raw = await _stored(js, run_id)
    return None if raw is None else RunHead.model_validate_json(raw)


async def run_writers(js: JetStreamContext, run_id: str) -> RunWriters | None:
    """Who may have written the run's checkpoint objects (None: not a run of this stack)."""
    raw = await _stored(js, run_id)
    return None if raw is None else RunWriters.model_validate_json(raw)


async def open_refusal(js: JetStreamContext, opened: RoundOpen) -> str | None:
    """Why a round open is not the run's (`admission.open_refusal`), read against the run's
    state in KV `runs`; None: it is."""
    # A poll for KV to catch up, not a retry of a failing call: plainer than tenacity's retry_if_result.
    deadline = time.monotonic() + STATE_LAG_S
    while True:
        state = await run_head(js, opened.run_id)  # every round: the config is not validated again
        why = admission.open_refusal(state, opened)
        if why is None or not admission.may_lag(state, opened) or time.monotonic() > deadline:
            return why
        await asyncio.sleep(0.1)
