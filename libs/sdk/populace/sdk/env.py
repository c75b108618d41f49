"""Environment as an agent: owns state, serves concurrent calls, fires triggers to listeners
(env → agents) and accepts reports (agents → env); envs nest so a group env can reduce its
members' partial results before its parent sees them."""

from __future__ import annotations

import asyncio
import inspect
from collections import defaultdict
from collections.abc import Callable
from typing import Any

Listener = Callable[[str, Any], Any]


class Env:
    def __init__(self, env_id: str, parent: Env | None = None) -> None:
        self.env_id = env_id
        self.parent = parent
        self.children: list[Env] = []
        self._listeners: dict[str, list[Listener]] = defaultdict(list)
        if parent is not None:
            parent.children.append(self)

    def listen(self, event: str, listener: Listener) -> Callable[[], None]:
        """Register a listener for an event ('*' for all). Returns an unsubscribe function."""
        self._listeners[event].append(listener)
        return lambda: self._listeners[event].remove(listener)

    async def emit(self, event: str, payload: Any) -> None:
        """Fire a trigger: every listener of `event` (and of '*') runs; coroutines concurrently."""
        pending = []
        for fn in (*self._listeners.get(event, ()), *self._listeners.get("*", ())):
            out = fn(event, payload)
            if inspect.isawaitable(out):
                pending.append(out)
        if pending:
            await asyncio.gather(*pending)
