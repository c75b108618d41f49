"""Model backends behind one interface: `await backend.serve(batch) -> (InferReply, calls)`.

- `dummy`: the paper's dummy benchmark, answered in the gateway itself.
- `local`, `sim`, `openai`: real OpenAI-compatible replicas (llama.cpp, the simulator,
  vLLM), served by the Dispatcher with routing, admission control, retries and re-asks."""

from __future__ import annotations

from typing import Protocol

from populace.core.contracts import InferBatch, InferReply, LlmCallBatch


class Backend(Protocol):
    async def serve(self, batch: InferBatch) -> tuple[InferReply, LlmCallBatch | None]: ...
