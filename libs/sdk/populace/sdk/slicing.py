"""Bounding how long the simulation's code holds a process's event loop.

A round starts thousands of turns at once; each runs the author's synchronous code (its
`Env.view`, the turn up to its first model call, a scene up to its first act) before it first
awaits. asyncio runs every callback that is ready when a loop iteration begins before it polls
I/O or fires a timer again, so thousands of turns doing milliseconds each hold the loop for tens
of seconds: heartbeats, control messages and the gateway's keepalives wait (a feed whose view
ranked a 5,000-post pool for 10,000 readers made a live host look dead). `await asyncio.sleep(0)`
does not help: it queues the task behind the others that are ready.

A `Slicer` is the gate author code passes before it runs (`enter()`): once author code has held
the loop for a slice (`slice_s`, tens of milliseconds), the turns that come next wait in line
until the loop has turned (polled I/O, fired its timers), and are let through a slice's worth at
a time, in the order they came. The check is cheap enough for a million agents: a counter per
entry, a clock read every few entries (fewer as author code is cheaper).

One slicer per event loop (`slicer_for`): every run and round on a process shares its loop.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Callable

SLICE_S = 0.05  # the default slice: the most author code runs between two turns of the loop
# At most this many entries pass between two clock reads (when author code is cheap: on the
# hot path of a million agents, one read per this many turns).
MOST_UNCHECKED = 64


def unchecked(remaining_s: float, cost_s: float) -> int:
    """How many entries may pass before the clock is read again: half of what the slice's
    remaining time holds at the measured cost per entry, at least 1, at most MOST_UNCHECKED."""
    if cost_s <= 0.0:
        return 1
    return max(1, min(MOST_UNCHECKED, int(remaining_s / cost_s / 2)))


def let_through(slice_s: float, cost_s: float, waiting: int) -> int:
    """How many waiting entries one turn of the loop lets through: a slice's worth at the
    measured cost per entry, at least one (an entry that alone takes longer than a slice still
    runs), at most those waiting."""
    if waiting <= 0:
        return 0
    if cost_s <= 0.0:
        return min(waiting, MOST_UNCHECKED)
    return max(1, min(waiting, int(slice_s / cost_s)))


class Slicer:
    """The gate (see the module's docstring). `clock`: seconds, monotonic (a test's fake)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, slice_s: float = SLICE_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if slice_s <= 0:
            raise ValueError(f"slice_s: {slice_s!r} is not a positive number of seconds")
        self.slice_s = slice_s
        self._loop = loop
        self._clock = clock
        self._countdown = 1  # entries until the next clock read
        self._batch = 1  # entries from the last clock read to the next
        self._started: float | None = None  # when author code began holding the loop this turn
        self._entries = 0  # entries in this turn's slice, counted at clock reads
        self._cost = 0.0  # measured seconds of author code per entry
        self._waiting: deque[asyncio.Future] = deque()  # entries held until the loop turns, first first
        self._again: list[asyncio.Future] = []  # let through, but the slice was spent first: first next turn
        self._tick_due = False  # _tick is queued: it runs once the loop has turned
        self._woken_at: float | None = None  # when the first entry let through this turn ran
        self._woken = 0  # entries let through this turn that ran
        self.held = 0  # entries that waited for the loop to turn (the slices author code filled)

    # -- the hot path ------------------------------------------------------------------------
    def enter(self):
        """Before author code runs: None (go on), or an awaitable to await first."""
        self._countdown -= 1
        if self._countdown > 0:
            return None
        return self._check()

    def room(self, most: int) -> int:
        """How many new units of author code (turns, scenes) to start in this turn of the loop:
        none while some wait at the gate, else a slice's worth at the measured cost (at most
        `most`). What a round's launcher asks before it starts more tasks, so that cheap turns
        start thousands at a time and slow ones a few."""
        if self._waiting or self._again:
            return 0
        if self._cost <= 0.0:
            return most  # nothing measured yet (this loop's first turns): the gate holds what is too slow
        return let_through(self.slice_s, self._cost, most)

    # -- the rest ------------------------------------------------------------------------------
    def _check(self):
        if self._waiting or self._again:  # others wait already: in line behind them
            return self._hold()
        now = self._clock()
        if self._started is None:  # the loop turned since author code last ran: a new slice
            self._started, self._entries = now, 1
            self._queue_tick()
        else:
            spent = now - self._started
            self._entries += self._batch
            self._cost = spent / self._entries
            if spent >= self.slice_s:
                return self._hold()
        self._countdown = self._batch = unchecked(self.slice_s - (now - self._started), self._cost)
        return None

    def _queue_tick(self) -> None:
        if not self._tick_due:
            self._tick_due = True
            self._loop.call_soon(self._tick)

    def _hold(self):
        self._countdown = 0  # every entry checks while some wait: it joins the line
        fut = self._loop.create_future()
        self._waiting.append(fut)
        self.held += 1
        self._queue_tick()
        return self._wait(fut)

    async def _wait(self, fut: asyncio.Future) -> None:
        while True:
            await fut
            now = self._clock()
            if self._woken_at is None:
                self._woken_at, self._woken = now, 1
                return
            self._cost = (now - self._woken_at) / self._woken
            self._woken += 1
            if now - self._woken_at < self.slice_s:
                return
            # those let through before it took the slice: first in line for the next turn, in order
            fut = self._loop.create_future()
            self._again.append(fut)
            self._queue_tick()

    def _tick(self) -> None:
        """Runs once the loop has turned since it was queued (a callback queued while the loop
        runs its ready callbacks waits for the next iteration, which polls I/O and fires timers
        first): the slice ends; a slice's worth of the waiting entries is let through."""
        self._tick_due = False
        self._started = None
        self._woken_at = None
        waiting = self._waiting
        if self._again:
            waiting.extendleft(reversed(self._again))
            self._again.clear()
        while waiting and waiting[0].done():  # cancelled while waiting (the round stopped)
            waiting.popleft()
        if not waiting:
            self._countdown = self._batch = 1  # the next entry starts a slice
            return
        n = let_through(self.slice_s, self._cost, len(waiting))
        for _ in range(n):
            while waiting and waiting[0].done():
                waiting.popleft()
            if not waiting:
                break
            waiting.popleft().set_result(None)
        # this turn's slice is theirs: an entry that comes meanwhile counts them in
        self._started, self._entries = self._clock(), n
        self._queue_tick()  # the next turn lets the next through (or ends the slice)


_SLICERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Slicer] = weakref.WeakKeyDictionary()


def slicer_for(loop: asyncio.AbstractEventLoop | None = None, slice_s: float = SLICE_S) -> Slicer:
    """The running loop's slicer (made on first use, with `slice_s`; later callers share it)."""
    loop = loop or asyncio.get_running_loop()
    slicer = _SLICERS.get(loop)
    if slicer is None:
        slicer = _SLICERS[loop] = Slicer(loop, slice_s)
    return slicer
