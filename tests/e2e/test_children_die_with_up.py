"""`populace up` and `populace demo` SIGKILLed (no clean-up of their own can run): every process
they started — nats-server, the services, the store's reaper — is gone soon after, and the
temporary JetStream store with them (or, for a store that is meant to stay, it was named when
the stack started). Before, nats-server went on under PID 1 with its store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from populace.core.natsserver import free_port

pytestmark = pytest.mark.e2e


def gone(p: psutil.Process) -> bool:
    """Exited (a zombie counts: here PID 1 does not always reap orphans, and a zombie holds nothing)."""
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(condition, what, timeout: float) -> None:
    """Until `condition()`; else fails with `what` (a callable: said as things stand then)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what() if callable(what) else what} after {timeout:.0f}s")
        time.sleep(0.2)


@pytest.mark.parametrize("command,ready", [
    (["up", "--hosts", "1"], "ready:"),
    (["demo", "--hosts", "1", "--agents", "100", "--rounds", "1000", "--latency", "1"], "ready in"),
])
def test_sigkill_of_the_launcher_leaves_no_process_and_no_temporary_store(tmp_path, command, ready):
    out = tmp_path / "out.txt"
    port = ["--port", str(free_port())] if command[0] == "up" else []
    with out.open("wb") as sink:
        launcher = subprocess.Popen([sys.executable, "-m", "populace.cli", *command, *port, "--db",
                                     str(tmp_path / "p.duckdb")], cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT,
                                    env={**os.environ, "COLUMNS": "400"})
    children: list[psutil.Process] = []
    try:
        wait_until(lambda: ready in out.read_text() or launcher.poll() is not None, "the stack was not ready", 600)
        assert launcher.poll() is None, out.read_text()
        children = psutil.Process(launcher.pid).children(recursive=True)
        nats = [c for c in children if c.name() == "nats-server"]
        assert len(nats) == 1 and len(children) >= 5, [c.cmdline()[:4] for c in children]
        argv = nats[0].cmdline()
        store = Path(argv[argv.index("-sd") + 1])
        assert store.is_dir()

        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        wait_until(lambda: all(gone(c) for c in children),
                   lambda: "still running: " + ", ".join(f"{c.pid} {' '.join(c.cmdline()[-2:])}"
                                                         for c in children if not gone(c)), 120)
        said = out.read_text()
        if store.name.startswith("populace-nats-") and str(store.parent) == tempfile.gettempdir():
            wait_until(lambda: not store.exists(), f"temporary store {store} left behind", 60)
        else:  # a store meant to outlive the stack: named when it started
            assert str(store) in said, said
    finally:
        for c in children:
            if not gone(c):
                c.kill()
        if launcher.poll() is None:
            launcher.kill()
