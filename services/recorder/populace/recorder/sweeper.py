"""The object store `checkpoints`, swept on a schedule: what belongs to no run goes (objects of a
run KV `runs` does not know, or written by a user that is none of the run's writers: a host never
placed in it). A host in no run filled the store with 1.5 GB in 12 s; the store's byte limit
stops it there, and this sweep gives the room back (populace.core.checkpoints.sweep)."""

from __future__ import annotations

import asyncio

from populace.core import checkpoints, logs

log = logs.get("populace.recorder")


class Sweeper:
    def __init__(self, js, every_s: float) -> None:
        self.js, self.every_s = js, every_s
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        if self.every_s > 0:
            self.task = asyncio.create_task(self.loop())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def loop(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self.once()

    async def once(self) -> checkpoints.Swept | None:
        """One sweep; a failure is logged (the next one tries again)."""
        try:
            swept = await checkpoints.sweep(self.js)
        except Exception as err:
            log.error("checkpoints_sweep_failed", error=f"{type(err).__name__}: {err}")
            return None
        if swept.subjects:
            log.warning("checkpoints_swept", subjects=swept.subjects, messages=swept.messages, runs=swept.runs[:20])
        return swept
