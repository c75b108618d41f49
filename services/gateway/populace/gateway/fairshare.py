"""Each requester's fair share of a gateway.

Requesters are the NATS users named by the request subject (`llm.infer.<requester>`: an
agent-host's own user, or the shared `agent-host`, `cli` …). Without shares, 4,500 requests from
one host, each within the gateway's caps (a dummy batch of 59 s), held every worker and paused
the run of every other host. With them:
- at most `capacity_batches` batches are in service at once (POPULACE_GATEWAY_MAX_WORKERS), and
  at most `capacity_prompts` prompts bound for real replicas (POPULACE_GATEWAY_MAX_QUEUE);
- one requester holds at most `share` of each (POPULACE_GATEWAY_REQUESTER_SHARE), so there is
  always room for the others, however early and however much one of them asked;
- a batch that cannot start now waits in its requester's own line; when a batch ends, the
  lines are served round-robin, one batch per requester per turn, so a long line never
  delays a short one;
- a requester's line holds at most `waiting_bytes` of requests
  (POPULACE_GATEWAY_REQUESTER_WAITING_BYTES); a request beyond it is refused at once (the
  requester retries later), so a flood costs the gateway bounded memory.
Pure bookkeeping; the gateway runs the batches (`start`)."""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _Waiting:
    prompts: int
    size: int
    run: Callable[[], Awaitable[None]]
    context: contextvars.Context


class FairShare:
    def __init__(self, capacity_batches: int, capacity_prompts: int, share: float, waiting_bytes: int) -> None:
        self.capacity_batches, self.capacity_prompts = capacity_batches, capacity_prompts
        self.cap_batches = max(1, int(capacity_batches * share))
        self.cap_prompts = max(1, int(capacity_prompts * share))
        self.waiting_bytes = waiting_bytes
        self.batches = self.prompts = 0  # in service now, every requester
        self.held: dict[str, list[int]] = {}  # requester -> [batches, prompts] in service
        self.lines: dict[str, deque[_Waiting]] = {}
        self.line_bytes: dict[str, int] = {}
        self.turns: deque[str] = deque()  # requesters with a line, in round-robin order
        self.tasks: set[asyncio.Task] = set()
        self.stopped = False

    def waiting(self, requester: str) -> int:
        return len(self.lines.get(requester, ()))

    def submit(self, requester: str, prompts: int, size: int, run: Callable[[], Awaitable[None]]) -> bool:
        """Start `run()` now if the requester's share allows, else put it in its line. False:
        its line is full (nothing is started or kept). `prompts`: what the batch costs real
        replicas (0 for the dummy model); `size`: its request's bytes."""
        line = self.lines.get(requester)
        if not line and self._fits(requester, prompts):
            self._start(requester, prompts, run, contextvars.copy_context())
            return True
        if line and self.line_bytes[requester] + size > self.waiting_bytes:
            return False
        if not line:
            line = self.lines[requester] = deque()
            self.line_bytes[requester] = 0
            self.turns.append(requester)
        line.append(_Waiting(prompts, size, run, contextvars.copy_context()))
        self.line_bytes[requester] += size
        return True

    def _fits(self, requester: str, prompts: int) -> bool:
        held_batches, held_prompts = self.held.get(requester, (0, 0))
        if self.batches >= self.capacity_batches or held_batches >= self.cap_batches:
            return False
        if not prompts:
            return True
        # A batch larger than a whole share still runs, alone.
        return ((not self.prompts or self.prompts + prompts <= self.capacity_prompts)
                and (not held_prompts or held_prompts + prompts <= self.cap_prompts))

    def _start(self, requester: str, prompts: int, run: Callable[[], Awaitable[None]],
               context: contextvars.Context) -> None:
        self.batches += 1
        self.prompts += prompts
        held = self.held.setdefault(requester, [0, 0])
        held[0] += 1
        held[1] += prompts
        # In the context the request came with (its trace), even when started by another's end.
        task = asyncio.get_running_loop().create_task(self._run(requester, prompts, run), context=context)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, requester: str, prompts: int, run: Callable[[], Awaitable[None]]) -> None:
        try:
            await run()
        finally:
            # also when cancelled: its worker is free (cancel() stops everything else)
            self.batches -= 1
            self.prompts -= prompts
            held = self.held[requester]
            held[0] -= 1
            held[1] -= prompts
            if not held[0]:
                del self.held[requester]
            self._dispatch()

    def _dispatch(self) -> None:
        """Start waiting batches, one per requester per turn, while they fit."""
        progress = True
        while progress and not self.stopped:
            progress = False
            for _ in range(len(self.turns)):
                if self.batches >= self.capacity_batches:
                    return  # whoever is next in turn stays next
                requester = self.turns.popleft()
                line = self.lines[requester]
                if self._fits(requester, line[0].prompts):
                    job = line.popleft()
                    self.line_bytes[requester] -= job.size
                    self._start(requester, job.prompts, job.run, job.context)
                    progress = True
                if line:
                    self.turns.append(requester)
                else:
                    del self.lines[requester], self.line_bytes[requester]

    def cancel(self) -> None:
        """Stop everything (the gateway stops): requesters notice the silence and ask another."""
        self.stopped = True
        self.lines.clear()
        self.line_bytes.clear()
        self.turns.clear()
        for task in list(self.tasks):
            task.cancel()
