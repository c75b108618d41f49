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


def test_the_guard_reads_its_grace_the_descriptors_to_pass_and_the_command():
    from populace.replicas.guard import parse

    assert parse(["8", "--", "vllm", "--", "x"]) == (8.0, [], ["vllm", "--", "x"])
    assert parse(["8", "--pass-fd", "5", "--pass-fd", "7", "--", "srv"]) == (8.0, [5, 7], ["srv"])
    for bad in (["8"], ["8", "--"], ["8", "--pass-fd", "--", "srv"], ["8", "--pass-fd", "x", "--", "srv"],
                ["8", "--other", "5", "--", "srv"], ["soon", "--", "srv"]):
        assert parse(bad) is None, bad


def test_the_guarded_command_serves_on_the_socket_its_starter_bound():
    """`--pass-fd N`: the command gets descriptor N (the port bound before it started: no other
    process can take it meanwhile), and only that one."""
    from populace.core.natsserver import bound_socket

    with bound_socket() as sock:
        sock.set_inheritable(True)
        fd = sock.fileno()
        serve = (f"import socket; s = socket.socket(fileno={fd}); s.listen(); c, _ = s.accept(); "
                 "c.sendall(b'served'); c.close()")
        guard = subprocess.Popen([sys.executable, "-m", "populace.replicas.guard", "1", "--pass-fd", str(fd), "--",
                                  sys.executable, "-c", serve], pass_fds=(fd,), start_new_session=True)
        port = sock.getsockname()[1]
    try:
        import socket

        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
                    assert c.recv(16) == b"served"
                    break
            except ConnectionRefusedError:  # not listening yet
                assert time.monotonic() < deadline, "the guarded command never served on the passed socket"
                time.sleep(0.1)
        assert guard.wait(10) == 0
    finally:
        if guard.poll() is None:
            os.killpg(guard.pid, signal.SIGKILL)
