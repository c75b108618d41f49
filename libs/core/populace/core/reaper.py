"""Removes an embedded nats-server's temporary store when the process that started it dies
without cleaning up (SIGKILL, a crash): `python -m populace.core.reaper PARENT_PID CHILD_PID DIR`.

Started by populace.core.natsserver next to the server it watches. While PARENT_PID lives it
only waits (a check a second: os.getppid() changes when the parent dies, whatever thread
started us); once the parent is gone it stops CHILD_PID (SIGTERM, then SIGKILL after 10 s) if
it still runs nats-server, then deletes DIR and says so on stderr (the server's log). A parent
that stops normally removes the store itself and kills this process first. Standard library
only, so it starts in milliseconds."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

GRACE_S = 10.0


def running(pid: int, name: str) -> bool:
    """Whether `pid` is a live process (not a zombie) whose command line mentions `name`."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z" and name.encode() in cmdline


def main(parent: int, child: int, store: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which stops us
    while os.getppid() == parent:
        time.sleep(1.0)
    if running(child, "nats-server"):
        os.kill(child, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while running(child, "nats-server") and time.monotonic() < deadline:
            time.sleep(0.05)
        if running(child, "nats-server"):
            os.kill(child, signal.SIGKILL)
    shutil.rmtree(store, ignore_errors=True)
    print(f"populace reaper: process {parent} died without stopping nats-server {child}: stopped it and "
          f"removed its temporary store {store}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
