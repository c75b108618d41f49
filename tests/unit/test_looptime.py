"""The responsive clock stands nearly still while something holds the loop."""

from __future__ import annotations

import asyncio
import time

from populace.core import looptime


async def test_the_clock_advances_with_the_loop_and_not_while_it_is_held():
    clock = looptime.of()
    assert looptime.of() is clock
    start = clock.now()
    await asyncio.sleep(0.5)
    turning = clock.now() - start
    assert 0.4 <= turning <= 0.7
    held_from = clock.now()
    time.sleep(1.0)  # noqa: ASYNC251 — holding the loop is what is measured
    await asyncio.sleep(0.25)
    held = clock.now() - held_from
    assert held <= 0.25 + 2 * looptime.MAX_STEP_S  # not the second the loop was held
