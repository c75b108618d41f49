"""Installing the local backend on first use must not hold up the checkout's other commands, and
whoever waits for it is told who holds it. Real uv, on a throwaway uv project whose `local`
extra is a package with a slow build (its build backend waits until the test opens a gate):
while it builds, `uv run` in that project answers at once (a build into the project's own
environment held uv's environment lock, and every `uv run` waited on it silently, for the
whole build); the built wheel is then installed from uv's cache, built once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from populace.replicas import llamacpp

UV = shutil.which("uv")
pytestmark = pytest.mark.skipif(UV is None, reason="uv is not on PATH")

BACKEND = '''
"""A PEP 517 backend that builds a one-module wheel once the gate file is gone (a slow build, on cue)."""
import base64, hashlib, os, time, zipfile

HERE = os.path.dirname(os.path.abspath(__file__))


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with open(os.path.join(HERE, "..", "builds.txt"), "a") as f:
        f.write("build\\n")
    while os.path.exists(os.path.join(HERE, "..", "gate")):
        time.sleep(0.05)
    name = "slowpkg-1.0-py3-none-any.whl"
    files = {"slowpkg.py": b"VALUE = 1\\n",
             "slowpkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\\nName: slowpkg\\nVersion: 1.0\\n",
             "slowpkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\\nGenerator: gate\\nRoot-Is-Purelib: true\\n"
                                           b"Tag: py3-none-any\\n"}
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(data)}")
        record.append("slowpkg-1.0.dist-info/RECORD,,")
        z.writestr("slowpkg-1.0.dist-info/RECORD", "\\n".join(record) + "\\n")
    return name
'''


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture
def project(tmp_path) -> Path:
    """A uv project whose extra `local` is `slowpkg` (a local package with the gated build)."""
    root = tmp_path / "proj"
    (root / "slowpkg").mkdir(parents=True)
    (root / "slowpkg" / "gatebackend.py").write_text(BACKEND)
    (root / "slowpkg" / "pyproject.toml").write_text(textwrap.dedent('''
        [build-system]
        requires = []
        build-backend = "gatebackend"
        backend-path = ["."]
        [project]
        name = "slowpkg"
        version = "1.0"
    '''))
    (root / "pyproject.toml").write_text(textwrap.dedent('''
        [project]
        name = "proj"
        version = "0.1.0"
        requires-python = ">=3.11"
        dependencies = []
        [project.optional-dependencies]
        local = ["slowpkg"]
        [tool.uv]
        package = false
        [tool.uv.sources]
        slowpkg = { path = "slowpkg" }
    '''))
    env = {k: v for k, v in os.environ.items() if k not in ("UV_PROJECT_ENVIRONMENT", "VIRTUAL_ENV")}
    subprocess.run([UV, "venv", "-q", "--python", sys.executable, str(root / ".venv")], check=True, env=env)
    subprocess.run([UV, "lock", "-q", "--project", str(root)], check=True, env=env)
    return root


def test_while_the_backend_builds_other_uv_runs_do_not_wait_and_it_is_built_once(project, monkeypatch):
    monkeypatch.delenv("UV_PROJECT_ENVIRONMENT", raising=False)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    (project / "gate").touch()
    python = str(project / ".venv" / "bin" / "python")
    said: list[str] = []
    failed: list[BaseException] = []

    def install() -> None:
        try:
            llamacpp._install(said.append, project / "install.log", root=project, python=python,
                              check=lambda: subprocess.run([python, "-c", "import slowpkg"]).returncode == 0)
        except BaseException as err:
            failed.append(err)

    worker = threading.Thread(target=install)
    worker.start()
    try:
        wait_for(lambda: (project / "builds.txt").exists(), "the build never started")
        # the build is held at the gate: a command that does not need it runs now
        other = subprocess.run([UV, "run", "--project", str(project), "python", "-c", "print('ran')"],
                               capture_output=True, text=True, timeout=120)
        assert other.returncode == 0 and other.stdout.strip() == "ran", other.stderr
        assert worker.is_alive()  # ... while the build still waits
    finally:
        (project / "gate").unlink()
        worker.join(300)
    assert not failed, failed
    assert (project / "builds.txt").read_text() == "build\n"  # once: the project's step used uv's cache
    assert said[-1].startswith("llama.cpp installed in")
    build, install = [line for line in (project / "install.log").read_text().splitlines() if line.startswith("$ ")]
    assert "UV_PROJECT_ENVIRONMENT=" in build and "--offline" not in build  # built beside the project's env
    assert "UV_PROJECT_ENVIRONMENT=" not in install and "--offline" in install  # then installed from the cache


def test_a_second_process_that_needs_it_says_who_holds_the_install(tmp_path):
    lock, gate = tmp_path / "install.lock", tmp_path / "gate"
    gate.touch()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f'''
        import os, sys, time
        from pathlib import Path
        from populace.replicas import llamacpp
        with llamacpp._locked(Path({str(lock)!r}), Path("/tmp/build.log"), print):
            print("locked", flush=True)
            while os.path.exists({str(gate)!r}):
                time.sleep(0.05)
    '''), "demo", "--model", "local"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        said: list[str] = []
        inside: list[str] = []

        def wait_then_hold() -> None:
            with llamacpp._locked(lock, tmp_path / "mine.log", said.append):
                inside.append(lock.read_text())

        waiter = threading.Thread(target=wait_then_hold)
        waiter.start()
        wait_for(lambda: said, "the waiting process said nothing")
        assert said[0].startswith(f"waiting for process {holder.pid} (`-c demo --model local`, since ")
        assert "build log /tmp/build.log): it is installing llama.cpp (the local backend)" in said[0]
        assert waiter.is_alive()
    finally:
        gate.unlink()
        holder.wait(60)
    waiter.join(60)
    assert not waiter.is_alive() and inside[0].startswith(f"process {os.getpid()} (")  # and says so in turn
    assert lock.read_text() == ""  # released: nobody holds it
