"""Where a round goes on one host: the seconds the simulation's code held the loop (its views,
turns, acts, scenes, settles, reduces and merges), the seconds a model call was out, and the
bytes of the views it made — accumulated per share and round, never a span or a log line per
agent (table `round_profile`, `populace results --profile`).

Cheap on the hot path: a view is timed whole (two clock reads beside code that builds an
observation); a turn only when sampled (the first TIMED_FIRST of a round, then one in
TIMED_EVERY), timed step by step while the turn runs, its sum scaled to the turns played; a
view's bytes are measured on the same kind of sample. A view or an observation larger than its
budget is said once per run (`Budget`), naming the hook, the agent, the round and the size.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_json

from populace.core import logs
from populace.core.contracts import DecideProfile, ShareProfile

log = logs.get("populace.sdk")

# The largest view (or shared observation) an agent should get, as JSON: a view is built on the
# agent's host before each turn, and what it holds goes into the agent's prompt. A larger one is
# said once per run (POPULACE_VIEW_BUDGET_BYTES on the fleet; `view_budget_bytes` in one process).
VIEW_BUDGET_BYTES = 64 * 1024
# The columns of table `round_profile`, in order (the recorder's, and a local run's rows).
PROFILE_KEYS = ("run_id", "round", "role", "host_id", "epoch", "agents", "wall_s", "view_s", "turn_s", "merge_s",
                "model_wait_s", "decide_s", "record_s", "view_bytes", "view_max_bytes", "observation_bytes", "held",
                "note")
TIMED_FIRST = 32  # the first turns of a share's round are timed (and their views sized) ...
TIMED_EVERY = 32  # ... then one in this many


def budget_bytes() -> int:
    """POPULACE_VIEW_BUDGET_BYTES, or the default: the budget of a run in this process."""
    raw = os.environ.get("POPULACE_VIEW_BUDGET_BYTES")
    if raw is None or not raw.strip():
        return VIEW_BUDGET_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"POPULACE_VIEW_BUDGET_BYTES: {raw!r} is not a number of bytes (1 or more)")
    return value


def sampled(i: int) -> bool:
    """Whether the i-th turn (or view) of a share's round is timed (sized)."""
    return i < TIMED_FIRST or i % TIMED_EVERY == 0


def size_of(value: Any) -> int | None:
    """A view's bytes as JSON (None: it is not JSON-serialisable, so it has no size to say)."""
    try:
        if isinstance(value, BaseModel):
            return len(value.__pydantic_serializer__.to_json(value))
        return len(to_json(value))
    except Exception:
        return None


def wire_size(doc: Any) -> int:
    """An announced document's bytes, as the round's messages carry it (compact JSON)."""
    return len(json.dumps(doc, separators=(",", ":")))


def human(n: int) -> str:
    """Bytes as people read them: 1.2 MB, 64 KB, 900 B."""
    if n >= 1024 * 1024:
        return f"{n / (1024 * 1024):.1f} MB"
    if n >= 1024:
        return f"{n / 1024:.0f} KB"
    return f"{n} B"


class Budget:
    """A run's view and observation budget, said once per run when passed (`over` returns the
    message the first time, None after)."""

    def __init__(self, limit: int = VIEW_BUDGET_BYTES) -> None:
        self.limit = limit
        self.said = False

    def over(self, what: str, size: int, where: str) -> str | None:
        if self.said or size <= self.limit:
            return None
        self.said = True
        note = (f"{what} returned {human(size)} {where}; budget {human(self.limit)} "
                f"(POPULACE_VIEW_BUDGET_BYTES): what an agent sees goes into its prompt and is built "
                f"before each turn; give it its own small part of the world (docs/worlds.md)")
        log.warning("view_over_budget", note=note, bytes=size, budget=self.limit)
        return note


@dataclass(slots=True)
class RoundCost:
    """One share's round, accumulated as it is played (see the module's docstring)."""

    agents: int = 0
    wall_s: float = 0.0
    view_s: float = 0.0
    views: int = 0  # views made
    views_sized: int = 0
    view_bytes_sized: int = 0
    view_max_bytes: int = 0
    turns: int = 0  # turns (or scenes) started
    turns_timed: int = 0
    turn_timed_s: float = 0.0
    merge_s: float = 0.0  # settle, reduce, merge
    model_wait_s: float = 0.0
    observation_bytes: int = 0
    held: int = 0
    note: str | None = None

    @property
    def turn_s(self) -> float:
        """The turns' seconds, the timed ones' scaled to all that ran."""
        return self.turn_timed_s * self.turns / self.turns_timed if self.turns_timed else 0.0

    @property
    def view_bytes(self) -> int:
        return round(self.view_bytes_sized * self.views / self.views_sized) if self.views_sized else 0

    def wire(self) -> ShareProfile:
        return ShareProfile(agents=self.agents, wall_s=self.wall_s, view_s=self.view_s, turn_s=self.turn_s,
                            merge_s=self.merge_s, model_wait_s=self.model_wait_s, view_bytes=self.view_bytes,
                            view_max_bytes=self.view_max_bytes, observation_bytes=self.observation_bytes,
                            held=self.held, note=self.note)


class Timed:
    """Awaits a coroutine (a turn, a scene) and adds the seconds its steps ran — not the time
    it waited — to `cost.turn_timed_s`. Used on sampled turns only: each step costs two clock
    reads and a generator hop."""

    __slots__ = ("coro", "cost")

    def __init__(self, coro: Coroutine, cost: RoundCost) -> None:
        self.coro, self.cost = coro, cost

    def __await__(self):
        coro, clock = self.coro, time.perf_counter
        spent = 0.0
        value: Any = None
        thrown: BaseException | None = None
        try:
            while True:
                t = clock()
                try:
                    yielded = coro.send(value) if thrown is None else coro.throw(thrown)
                except StopIteration as stop:
                    return stop.value
                finally:
                    spent += clock() - t
                try:
                    value, thrown = (yield yielded), None
                except BaseException as err:  # thrown into the turn (a cancellation): it decides
                    value, thrown = None, err
        finally:
            self.cost.turn_timed_s += spent
            self.cost.turns_timed += 1


class Outstanding:
    """Seconds during which at least one model call was out (a port counts its calls or batches
    going out and coming back; overlapping calls count once)."""

    __slots__ = ("_out", "_since", "seconds")

    def __init__(self) -> None:
        self._out = 0
        self._since = 0.0
        self.seconds = 0.0

    def begin(self) -> None:
        if self._out == 0:
            self._since = time.perf_counter()
        self._out += 1

    def end(self) -> None:
        self._out -= 1
        if self._out == 0:
            self.seconds += time.perf_counter() - self._since

    def now(self) -> float:
        """The seconds so far, a call out now counted to this moment."""
        return self.seconds + (time.perf_counter() - self._since if self._out else 0.0)


def decide_profile(merge_s: float, decide_s: float, observation_bytes: int, note: str | None) -> DecideProfile:
    return DecideProfile(merge_s=merge_s, decide_s=decide_s, observation_bytes=observation_bytes, note=note)
