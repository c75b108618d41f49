"""What the fault tests share: wait, on a live stack, until a run is inside round N (read from
KV `runs`), then kill some of the stack's processes there (and start them again if asked)."""

from __future__ import annotations

import asyncio
import time

from nats.js.errors import NoKeysError

from populace.client.stack import Stack


async def round_started(nc, round_: int, timeout_s: float = 120) -> str:
    """The key of the first running run found in round `round_` (polled every 0.2 s); an
    AssertionError naming the round if none is within `timeout_s`."""
    kv = await nc.jetstream().key_value("runs")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            keys = await kv.keys()
        except NoKeysError:  # the run is not in KV yet (a test alone on a new stack)
            keys = []
        for key in keys:
            state = (await kv.get(key)).value
            if b'"status":"running"' in state and f'"round":{round_}'.encode() in state:
                return key
        await asyncio.sleep(0.2)
    raise AssertionError(f"round {round_} never started")


async def kill_in_round(nc, stack: Stack, round_: int, *keys: str, settle_s: float,
                        restart_after_s: float | None = None) -> None:
    """SIGKILL the stack's processes `keys` `settle_s` after round `round_` started (inside the
    round: its agents wait on the model); with `restart_after_s`, start them again that long after."""
    await round_started(nc, round_)
    await asyncio.sleep(settle_s)
    for key in keys:
        stack.kill(key)
    if restart_after_s is not None:
        await asyncio.sleep(restart_after_s)
        for key in keys:
            stack.restart(key)
