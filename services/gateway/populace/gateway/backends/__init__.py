"""Model backends behind one interface: `await backend.complete(batch) -> list[str]`."""

from __future__ import annotations

from typing import Protocol

from populace.core.contracts import InferBatch


class Backend(Protocol):
    name: str

    async def complete(self, batch: InferBatch) -> list[str]: ...


def make_backend(name: str) -> Backend:
    if name == "dummy":
        from populace.gateway.backends.dummy import DummyBackend

        return DummyBackend()
    raise ValueError(f"model.backend: unknown backend {name!r}")
