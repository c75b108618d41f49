"""An exception no code waits for (a task dropped with its error) is one structured error line
with its cause, and counted: populace.core.logs.watch_unobserved, which every service installs."""

from __future__ import annotations

import asyncio
import gc

from populace.core import logs


async def test_a_dropped_tasks_exception_is_logged_once_with_its_cause_and_counted(capsys):
    logs.configure("INFO", "json")
    counted = []
    logs.watch_unobserved(lambda: counted.append(1))
    logs.watch_unobserved(lambda: counted.append(2))  # a second service on the loop: installed once

    async def fails() -> None:
        raise ConnectionError("outbound buffer limit exceeded")

    task = asyncio.get_running_loop().create_task(fails())
    await asyncio.sleep(0.01)
    assert task.done()
    del task
    gc.collect()
    err = capsys.readouterr().err
    assert counted == [1]
    lines = [line for line in err.splitlines() if logs.UNOBSERVED_EVENT in line]
    assert len(lines) == 1
    assert "ConnectionError: outbound buffer limit exceeded" in lines[0]
    assert "Task exception was never retrieved" in lines[0]  # asyncio's own words, kept as the message
    assert "Traceback" in lines[0] and '"level": "error"' in lines[0]
