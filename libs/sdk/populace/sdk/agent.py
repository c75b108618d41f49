"""The agent model: a small object (an id, a persona by reference, a bounded memory) with
`async reply(msg)`. Hosts keep hundreds of thousands of these in one process."""

from __future__ import annotations

from typing import Any


class Agent:
    __slots__ = ("agent_id", "persona", "memory")

    memory_size: int = 5

    def __init__(self, agent_id: int, persona: Any = None) -> None:
        self.agent_id = agent_id
        self.persona = persona  # a reference (population index), never a per-agent copy
        self.memory: tuple = ()

    def remember(self, item: Any) -> None:
        size = self.memory_size
        if size <= 0:
            return
        mem = self.memory + (item,)
        self.memory = mem[-size:] if len(mem) > size else mem

    async def reply(self, msg: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.agent_id})"
