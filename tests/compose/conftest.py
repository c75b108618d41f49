"""Fixtures of the compose tier (helpers in compose_project.py): the engine or a skip, the
images built once per session."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from compose_project import TEST_FILE, sh, unavailable


@pytest.fixture(scope="session")
def engine() -> None:
    """A Docker engine and the compose v2 CLI, or a skip (a failure in CI) saying how to get them."""
    if shutil.which("docker") is None:
        unavailable("no `docker` command")
    if sh(["docker", "compose", "version"], check=False, timeout=30).returncode != 0:
        unavailable("no `docker compose` (compose v2 plugin)")
    info = sh(["docker", "info", "--format", "{{.ServerVersion}}"], check=False, timeout=30)
    if info.returncode != 0:
        unavailable(f"`docker info` failed: {(info.stderr or info.stdout).strip()[:300]}")


@pytest.fixture(scope="session")
def images(engine) -> dict[str, str]:
    """The environment deploy/local-images.sh prints (base images, COMPOSE_FILE …), after it
    built whatever was missing, and the Populace image built once by compose."""
    if os.geteuid() != 0 and sh(["docker", "image", "inspect", "populace-base:bookworm"], check=False).returncode:
        unavailable("deploy/local-images.sh needs root (mmdebstrap) to build the base image")
    out = sh(["bash", "deploy/local-images.sh"], timeout=900).stdout
    env = dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines() if line.startswith("export "))
    env["COMPOSE_FILE"] += ":" + TEST_FILE
    # One service builds the image every service runs (`up` then finds it: no parallel copies)
    t = time.monotonic()
    sh(["docker", "compose", "build", "orchestrator"], env={**os.environ, **env}, timeout=1200)
    env["_build_s"] = f"{time.monotonic() - t:.1f}"
    return env
