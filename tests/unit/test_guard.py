"""populace.replicas.guard: a guarded command's whole process group goes when the guard is
stopped or when its starter dies, even a child that ignores SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups via /proc: Linux")

# a server that starts a child ignoring SIGTERM (as vLLM's web server could wait for ever)
STUBBORN = ("import signal, subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)']); time.sleep(600)")


def gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_stopping_the_guard_stops_its_whole_group():
    guard = subprocess.Popen([sys.executable, "-m", "populace.replicas.guard", "1", "--", sys.executable, "-c",
                              STUBBORN], start_new_session=True)
    time.sleep(1.5)
    guard.send_signal(signal.SIGTERM)
    guard.wait(10)
    ok = gone(guard.pid, 10)
    if not ok:
        os.killpg(guard.pid, signal.SIGKILL)
    assert ok


def test_a_killed_starter_takes_the_guarded_group_with_it():
    starter = subprocess.Popen([sys.executable, "-c",
                                "import subprocess, sys, time; from populace.core.processes import die_with_parent; "
                                "p = subprocess.Popen([sys.executable, '-m', 'populace.replicas.guard', '1', '--', "
                                f"sys.executable, '-c', {STUBBORN!r}], start_new_session=True, "
                                "preexec_fn=die_with_parent()); print(p.pid, flush=True); time.sleep(600)"],
                               stdout=subprocess.PIPE, text=True)
    pgid = int(starter.stdout.readline())
    time.sleep(1.5)
    starter.kill()
    starter.wait(10)
    ok = gone(pgid, 10)
    if not ok:
        os.killpg(pgid, signal.SIGKILL)
    assert ok
