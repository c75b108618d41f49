"""`populace manager` as a real process (uvicorn on a free port of 127.0.0.1, with a token, on
a real nats-server), attacked over raw sockets as issue 26 describes:

- a body far larger than any form (200 MB declared in Content-Length) is refused with a 413
  before a byte of it is sent, on the start form and on the sign-in form;
- a body with no length (chunked) is refused once it passes the limit: the client is answered
  while it is still sending, after a few MB at most, and the manager's peak memory does not
  grow by the body;
- twenty wrong bearer tokens sent at once from one address: ten are compared (401) and the
  rest are refused unread (429), so concurrency does not multiply the guesses.

The manager's process is ended by its PID."""

from __future__ import annotations

import concurrent.futures
import os
import select
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from populace.core.natsserver import free_port
from populace.core.processes import terminate

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TOKEN = "limits-test-token-0123456789"
DECLARED = 200 * 2**20  # what the attacker announces
CHUNK = 64 * 1024
GIVE_UP = 64 * 2**20  # the test stops sending here: a manager that reads everything fails it


@pytest.fixture(scope="module")
def manager(nats_server, tmp_path_factory):
    """(port, pid) of `populace manager --token` on 127.0.0.1."""
    port = free_port()
    log = tmp_path_factory.mktemp("manager-limits") / "manager.log"
    env = {**os.environ, "POPULACE_MANAGER_TOKEN": TOKEN}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "populace.cli", "manager", "--nats", nats_server.url,
                                 "--host", "127.0.0.1", "--port", str(port)], stdout=out, stderr=out, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as res:
                    if res.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            assert time.monotonic() < deadline, "the manager did not answer /healthz within 60 s"
            time.sleep(0.2)
        yield port, proc.pid
    finally:
        terminate(proc)


def peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM), bytes."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def head(path: str, port: int, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}",
             "Content-Type: application/x-www-form-urlencoded", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def status_of(sock: socket.socket) -> int:
    data = b""
    while b"\r\n" not in data:
        more = sock.recv(4096)
        if not more:
            break
        data += more
    return int(data.split(b" ", 2)[1])


@pytest.mark.parametrize(("path", "auth"), [("/start", True), ("/login", False)])
def test_a_body_declared_too_large_is_refused_before_it_is_sent(manager, path, auth):
    port, pid = manager
    before = peak_rss(pid)
    headers = {"Content-Length": str(DECLARED), **({"Authorization": f"Bearer {TOKEN}"} if auth else {})}
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head(path, port, headers))
        # nothing of the body is sent: a manager that waits for it never answers (socket timeout)
        assert status_of(sock) == 413
    assert peak_rss(pid) - before < 16 * 2**20


@pytest.mark.parametrize(("path", "auth", "limit"), [("/start", True, 2**20), ("/login", False, 4096)])
def test_a_body_without_a_length_is_cut_off_at_the_limit(manager, path, auth, limit):
    port, pid = manager
    before = peak_rss(pid)
    headers = {"Transfer-Encoding": "chunked", **({"Authorization": f"Bearer {TOKEN}"} if auth else {})}
    chunk = b"%x\r\n" % CHUNK + b"a" * CHUNK + b"\r\n"
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head(path, port, headers))
        while sent < GIVE_UP:
            readable, writable, _ = select.select([sock], [sock], [], 30)
            assert readable or writable, "the manager neither read nor answered for 30 s"
            if readable:
                break  # answered while the body is still coming
            sock.sendall(chunk)
            sent += CHUNK
        assert status_of(sock) == 413
    # what was sent before the answer: the limit, plus what the socket buffers held
    assert sent < limit + 8 * 2**20, f"{sent:,} bytes were sent before the 413"
    assert peak_rss(pid) - before < 16 * 2**20


def test_concurrent_wrong_tokens_are_counted_before_any_is_answered(manager):
    port, _ = manager

    def guess(i: int) -> int:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/runs",
                                     headers={"Authorization": f"Bearer wrong-{i}"})
        try:
            with urllib.request.urlopen(req, timeout=30) as res:
                return res.status
        except urllib.error.HTTPError as err:
            return err.code

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        codes = sorted(pool.map(guess, range(20)))
    assert codes == [401] * 10 + [429] * 10
    # the right token from this address still gets in: guessing never locks the operator out
    assert guess_with(port, TOKEN) == 200


def guess_with(port: int, token: str) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/runs", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as res:
            return res.status
    except urllib.error.HTTPError as err:
        return err.code
