"""Time an event loop spent turning: a clock that advances while the loop is responsive and
stands nearly still while something holds it (a million agents' turns woken at once, an author's
slow `view`). A deadline that means "the other side said nothing for 5 s" is measured on it, so a
process that could not read its socket for 8 s does not blame the silence on its peer (a host
re-sent batches the gateway was still working on, and took its own lag for a dead gateway)."""

from __future__ import annotations

import asyncio
import contextlib
import weakref

TICK_S = 0.1
# A tick that came later than this counts as this much: the rest of its wait, the loop was held.
MAX_STEP_S = 2 * TICK_S


class ResponsiveClock:
    """One per loop (`of(loop)`), ticking every TICK_S in a task of its own while anyone asks it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._last = loop.time()
        self._turned = 0.0  # responsive seconds up to self._last
        self._task: asyncio.Task | None = None

    def now(self) -> float:
        """Responsive seconds since this clock started (monotonic)."""
        self._ensure_ticking()
        return self._turned + min(self._loop.time() - self._last, MAX_STEP_S)

    def _ensure_ticking(self) -> None:
        if self._task is None or self._task.done():
            self._last = self._loop.time()
            self._task = self._loop.create_task(self._tick())

    async def _tick(self) -> None:
        loop = self._loop
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await asyncio.sleep(TICK_S)
                now = loop.time()
                self._turned += min(now - self._last, MAX_STEP_S)
                self._last = now


_clocks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ResponsiveClock] = weakref.WeakKeyDictionary()


def of(loop: asyncio.AbstractEventLoop | None = None) -> ResponsiveClock:
    """The running loop's clock (made on first use)."""
    loop = loop or asyncio.get_running_loop()
    clock = _clocks.get(loop)
    if clock is None:
        clock = _clocks[loop] = ResponsiveClock(loop)
    return clock
