"""One agent per OS process (the paper's mapping for compute-heavy agents).

Each agent lives in its own forked process and runs the very same `reply()` code; only
its LLM calls are proxied through a pipe to the host, which batches them with everyone
else's. The host keeps a small proxy object per agent."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
from multiprocessing.connection import Connection

from populace.games.player import GuessPlayer, Turn
from populace.sdk.agent import Agent
from populace.sdk.llm import InferError


class _PipeLLM:
    """The child's LLM: sends the prompt to the host and waits for the text."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def ask(self, key: int, prompt: str, prefix_chars: int = 0) -> asyncio.Future:
        self._conn.send(("ask", prompt, prefix_chars))
        raw, error = self._conn.recv()
        fut = asyncio.get_running_loop().create_future()
        if error is not None:
            fut.set_exception(InferError(error))
        else:
            fut.set_result(raw)
        return fut


def _child_main(conn: Connection, agent_id: int, persona: str | None) -> None:
    agent = GuessPlayer(agent_id, persona)
    llm = _PipeLLM(conn)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "stop":
            return
        _, round_, history_text, max_value, answer = msg
        turn = Turn(round=round_, history_text=history_text, max_value=max_value, llm=llm,  # type: ignore[arg-type]
                    answer=answer)
        value, raw = asyncio.run(agent.reply(turn))
        conn.send(("done", value, raw, os.getpid()))


class ProcessAgent(Agent):
    """Host-side proxy of an agent that runs in its own process."""

    __slots__ = ("proc", "conn", "pid")

    def __init__(self, agent_id: int, persona: str | None = None) -> None:
        super().__init__(agent_id, persona)
        parent, child = mp.get_context("fork").Pipe()
        self.proc = mp.get_context("fork").Process(target=_child_main, args=(child, agent_id, persona),
                                                   daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        self.pid = self.proc.pid

    async def _recv(self):
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        fd = self.conn.fileno()

        def ready() -> None:
            loop.remove_reader(fd)
            try:
                fut.set_result(self.conn.recv())
            except Exception as err:  # noqa: BLE001 - child died
                fut.set_exception(err)

        loop.add_reader(fd, ready)
        return await fut

    async def reply(self, turn: Turn) -> tuple[float | None, str]:
        self.conn.send(("turn", turn.round, turn.history_text, turn.max_value, turn.answer))
        while True:
            msg = await self._recv()
            if msg[0] == "ask":
                try:
                    raw, error = await turn.llm.ask(self.agent_id, msg[1], msg[2]), None
                except InferError as err:
                    raw, error = None, str(err)
                self.conn.send((raw, error))
            else:
                _, value, raw, _pid = msg
                self.remember((turn.round, value))
                return value, raw

    def stop(self) -> None:
        try:
            self.conn.send(("stop",))
        except OSError:
            pass
        self.proc.join(timeout=2)
        if self.proc.is_alive():
            self.proc.kill()
        self.conn.close()
