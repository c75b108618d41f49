"""One agent per OS process (the paper's mapping for compute-heavy agents).

Each agent lives in its own forked process and runs its very own `turn()` (or a scene's
`act()`) code there; only its LLM calls travel, through a pipe, to the host, which batches them
with everyone else's (`PipeLLM` is the child's LLM port; the call's `key` travels with it). The
host keeps a small proxy per agent. Observations, views, outcomes and group news are pickled
across the pipe."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
from multiprocessing.connection import Connection
from typing import Any

from populace.sdk.agent import Agent
from populace.sdk.llm import LLM, InferError
from populace.sdk.outcome import Outcome
from populace.sdk.simulation import Observation


class AgentRaised(RuntimeError):
    """The agent's turn raised in its own process; the message carries its type and text."""


class PipeLLM:
    """The child's LLM port: sends the request to the host and waits for the text."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def ask(self, prompt: str, *, key: int, prefix_chars: int = 0, system: str | None = None,
            schema: dict | None = None) -> asyncio.Future:
        self._conn.send(("ask", prompt, key, prefix_chars, system, schema))
        text, error, kind = self._conn.recv()
        fut = asyncio.get_running_loop().create_future()
        if error is not None:
            fut.set_exception(InferError(error) if kind == "infer" else AgentRaised(error))
        else:
            fut.set_result(text)
        return fut


def _child_main(conn: Connection, agent: Agent) -> None:
    llm = PipeLLM(conn)
    if agent.sim is not None:
        # in-edges live on the host, which applies every edit: a copy here would go stale, so
        # following() says to read them from the environment's view instead
        agent.sim.edges = None
    loop = asyncio.new_event_loop()
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "stop":
            return
        if msg[0] == "settled":
            try:
                agent.settled(msg[1], msg[2])
            except Exception:
                pass
            continue
        if msg[0] == "state":
            conn.send(("state", agent.state()))
            continue
        if msg[0] == "restore":
            agent.restore(msg[1])
            continue
        if msg[0] == "wakes":
            try:  # ("wakes", obs) or ("wakes", obs, view): the form the agent's class declares
                conn.send(("wakes", bool(agent.wakes(*msg[1:])), None))
            except Exception as err:
                conn.send(("wakes", False, f"{type(err).__name__}: {err}"))
            continue
        try:
            work = agent.act(msg[1], msg[2], llm) if msg[0] == "act" else agent.turn(msg[1], llm)
            out = loop.run_until_complete(work)
        except InferError as err:
            conn.send(("infer_error", str(err)))
        except AgentRaised as err:  # already "Type: message", as the host records an agent's error
            conn.send(("raised", str(err)))
        except Exception as err:
            conn.send(("raised", f"{type(err).__name__}: {err}"))
        else:
            conn.send(("done", out))


class ProcessAgent(Agent):
    """Host-side proxy of an agent that runs in its own process."""

    __slots__ = ("conn", "pid", "proc")

    def __init__(self, agent: Agent) -> None:
        super().__init__(agent.id, agent.persona, agent.sim)
        ctx = mp.get_context("fork")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_child_main, args=(child, agent), daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        self.pid = self.proc.pid

    async def _recv(self) -> Any:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        fd = self.conn.fileno()

        def ready() -> None:
            loop.remove_reader(fd)
            try:
                fut.set_result(self.conn.recv())
            except Exception as err:
                fut.set_exception(err)

        loop.add_reader(fd, ready)
        return await fut

    async def turn(self, obs: Observation, llm: LLM) -> Outcome:
        self.conn.send(("turn", obs))
        return await self._relay(llm)

    async def act(self, phase: str, view: Any, llm: LLM) -> Outcome:
        self.conn.send(("act", phase, view))
        return await self._relay(llm)

    def wakes(self, obs: Observation, *view: Any) -> bool:
        # Between rounds: nothing else is on the pipe, and the child answers at once. The exchange
        # is synchronous (selection is), but an event loop that watched the pipe (uvloop's, on an
        # agent-host, after a turn) left it non-blocking: a recv before the answer came would raise
        # BlockingIOError, so the pipe blocks for this exchange only.
        fd = self.conn.fileno()
        was = os.get_blocking(fd)
        os.set_blocking(fd, True)
        try:
            self.conn.send(("wakes", obs, *view))
            _, wakes, error = self.conn.recv()
        finally:
            os.set_blocking(fd, was)
        if error is not None:
            raise AgentRaised(error)
        return wakes

    async def _relay(self, llm: LLM) -> Outcome:
        """Relay the child's model calls (with their own key) until its turn or act returns."""
        while True:
            msg = await self._recv()
            if msg[0] == "ask":
                _, prompt, key, prefix_chars, system, schema = msg
                try:
                    text, error, kind = await llm.ask(prompt, key=key, prefix_chars=prefix_chars,
                                                      system=system, schema=schema), None, None
                except InferError as err:
                    text, error, kind = None, str(err), "infer"
                except Exception as err:  # the port raised (a scripted error): the child's call raises it too
                    text, error, kind = None, f"{type(err).__name__}: {err}", "raised"
                self.conn.send((text, error, kind))
            elif msg[0] == "done":
                return msg[1]
            elif msg[0] == "infer_error":
                raise InferError(msg[1])
            else:
                raise AgentRaised(msg[1])

    def settled(self, outcome: Outcome, news: Any) -> None:
        self.conn.send(("settled", outcome, news))

    def state(self) -> dict[str, Any]:
        raise TypeError("a process agent's state lives in its process: await fetch_state()")

    async def fetch_state(self) -> dict[str, Any]:
        """The child's agent's declared state (between rounds: nothing else is on the pipe).
        Async: the event loop watches the pipe (non-blocking), so a blocking recv would fail."""
        self.conn.send(("state",))
        reply = await self._recv()
        return reply[1]

    def restore(self, state: dict[str, Any]) -> None:
        self.conn.send(("restore", state))

    def stop(self) -> None:
        try:
            self.conn.send(("stop",))
        except OSError:
            pass
        self.proc.join(timeout=2)
        if self.proc.is_alive():
            self.proc.kill()
        self.conn.close()
