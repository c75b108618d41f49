"""The LLM port: the one way an agent reaches a model.

    text = await llm.ask(prompt, key=self.id)

`ask` returns the model's raw text for one structured call. The run's system prompt and
answer schema (the simulation's `system_prompt()` and `answer_schema()`) apply unless the
call passes its own. `key` is the agent's id: it seeds the agent's sampling and, with
`prefix_chars` (how much of the prompt's start stays the same every round, e.g. the persona),
keeps the agent on one replica's prefix cache.

Three implementations share this interface:
- `populace.sdk.nats_llm.InferSession`: batched requests to the inference gateway (the fleet);
- `populace.sdk.process.PipeLLM`: a child process's calls, relayed to its host (one agent per process);
- `populace.sdk.mock.ScriptedLLM` / `DummyLLM`: answers in process, for tests and local runs.

When no model can answer (no gateway, no replica), the fleet's port asks again, with backoff,
and only when the model path stays down raises `ModelUnavailable`: an infrastructure failure
is never an agent's answer. The round stops there and the run pauses with the reason.
"""

from __future__ import annotations

from asyncio import current_task
from collections.abc import Awaitable
from contextvars import ContextVar
from typing import Protocol, runtime_checkable

# Who is asking: the agent whose turn (or act) runs in this task. The ports seed each call by the
# caller's own count of calls with that key in the round, so the draws never depend on how other
# agents' calls interleave with it — or on which host, or process, the agents are.
# A scene's act sets CALLER; an agent's turn is registered in TURNS instead (task -> agent id, by
# the round engine): a context variable set in each of a million turn tasks cost the hot path
# two objects the cyclic GC tracks per task, for as long as the task lived.
CALLER: ContextVar[int | None] = ContextVar("populace_caller", default=None)
# An interview's question being answered in this task: its tag base (populace.sdk.interview,
# bit 62 set plus the question's digest), which no call of a round can have.
ASKING: ContextVar[int | None] = ContextVar("populace_asking", default=None)
# That question's calls so far by this agent, when the interview counts them itself: the port
# then keeps no count of its own (one entry per agent and question, held by the port until the
# interview ends: a million of them for a question asked of a million agents).
ASKING_CALLS: ContextVar[int | None] = ContextVar("populace_asking_calls", default=None)
TURNS: dict = {}
# The member whose act `Scene.all` is stepping right now (populace.sdk.scene): it drives a stage's
# acts without a task each, one synchronous step at a time, and names the stepping member here, a
# plain global (a context variable set and reset per step cost more than the rest of the step).
ACTING: int | None = None


def call_tag(counts: dict, key: int) -> int:
    """A call's tag in its round (`InferBatch.seqs`): 0 for an agent's first call for itself,
    seeded as one call per round always was; its n-th call for itself: n; a call on another
    key's behalf: the caller in the high bits, so it never shares a draw with that key's own;
    an interview's n-th call of a question: the question's tag base + n."""
    asking = ASKING.get()
    if asking is not None:
        counted = ASKING_CALLS.get()
        if counted is not None:
            return asking | counted
        slot = ("asking", asking, key)
        n = counts.get(slot, 0)
        counts[slot] = n + 1
        return asking | n
    caller = CALLER.get()
    if caller is None:
        caller = ACTING
    if caller is None:
        try:
            caller = TURNS.get(current_task())
        except RuntimeError:  # no event loop: not inside a turn
            caller = None
    if caller is None or caller == key:
        n = counts.get(key, 0)
        counts[key] = n + 1
        return n
    pair = (caller, key)
    n = counts.get(pair, 0)
    counts[pair] = n + 1
    return ((caller + 1) << 32) | n


class InferError(RuntimeError):
    """No model answered (after retries)."""


class ModelUnavailable(InferError):
    """No model answered for as long as the run waits for one: the run pauses, nothing is
    recorded as the agents' answers."""


@runtime_checkable
class LLM(Protocol):
    def ask(self, prompt: str, *, key: int, prefix_chars: int = 0, system: str | None = None,
            schema: dict | None = None) -> Awaitable[str]: ...
