"""Stopping child processes: SIGTERM first, SIGKILL what is still running after a grace time;
and children that cannot outlive their parent (`die_with_parent`)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def terminate(proc: subprocess.Popen, timeout: float = 10.0) -> bool:
    """Stop one process. Returns True when it had to be killed."""
    return bool(stop_all({"_": proc}, timeout))


def stop_all(procs: dict[str, subprocess.Popen], timeout: float = 15.0) -> list[str]:
    """SIGTERM every process, then SIGKILL (its whole process group, if it leads one) those
    still running after `timeout` in total. Returns the names that had to be killed."""
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    killed = []
    for name, p in procs.items():
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            killed.append(name)
            try:
                if os.getpgid(p.pid) == p.pid:
                    os.killpg(p.pid, signal.SIGKILL)
                else:
                    p.kill()
            except ProcessLookupError:
                pass
            p.wait()
    return killed


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Cleanup that a second Ctrl-C cannot cut short: SIGINT and SIGTERM are ignored inside
    (main thread only; elsewhere signals do not arrive anyway). Without this, a launcher that
    sends SIGINT twice (uv, a supervisor, the process group) interrupted stopping the services
    and left nats-server running on its port."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for Popen: on Linux the child gets `sig` when this process dies, even by
    SIGKILL (prctl PR_SET_PDEATHSIG), so a killed launcher leaves no orphan — for any program,
    not only our services (which also watch POPULACE_PARENT_PID), e.g. llama.cpp or vLLM.
    Elsewhere: None (no preexec_fn). The signal comes when the *thread* that started the
    child ends: start children from the main thread (an event loop's), never a worker thread."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def arm() -> None:  # runs in the child, between fork and exec
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody will signal us
            os.kill(os.getpid(), sig)

    return arm


def guarded() -> Callable[[], None] | None:
    """`preexec_fn` for a child that must not outlive this process: die_with_parent() when
    called on the main thread, None on any other (the death signal would come when that thread
    ends — a fault test's restart thread would kill the child it just started). Children of
    `populace up`, `demo` and `simulate()` start on the main thread; our services also watch
    POPULACE_PARENT_PID, and an embedded nats-server's temporary store has a reaper (natsserver)."""
    return die_with_parent() if threading.current_thread() is threading.main_thread() else None
