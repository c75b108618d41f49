"""compose.yaml without a Docker engine: each service's command (the image's ENTRYPOINT plus
its `command`) and environment, exactly as compose.yaml declares them, run as local processes
with container host names mapped to localhost — and a game plays through them. Plus the
compose files validate against the compose specification."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus
from populace.core.contracts import RunConfig
from populace.core.processes import terminate

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
INFRASTRUCTURE = {"nats", "jaeger"}  # run here by the test itself (nats) or not at all (jaeger)


def entrypoint() -> list[str]:
    line = next(x for x in (ROOT / "deploy/Dockerfile").read_text().splitlines() if x.startswith("ENTRYPOINT"))
    return json.loads(line.removeprefix("ENTRYPOINT").strip())


def expand(value: str, env: dict[str, str]) -> str:
    """${VAR:-default} and ${VAR} as compose interpolates them."""
    def sub(m: re.Match) -> str:
        name, default = m.group(1), m.group(3) or ""
        return env.get(name) or default
    return re.sub(r"\$\{(\w+)(:-([^}]*))?\}", sub, value)


def compose_services(profiles: set[str] = frozenset()) -> dict[str, dict]:
    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())  # resolves the x-populace anchors
    out = {}
    for name, svc in doc["services"].items():
        if name in INFRASTRUCTURE or (svc.get("profiles") and not profiles & set(svc["profiles"])):
            continue
        out[name] = svc
    return out


def test_compose_declares_every_service():
    services = compose_services()
    assert set(services) == {"orchestrator", "environment", "gateway", "recorder", "agent-host"}
    for name, svc in services.items():
        assert entrypoint() + svc["command"] == ["populace", "service", name]


@pytest.mark.skipif(shutil.which("check-jsonschema") is None and shutil.which("uvx") is None,
                    reason="no compose validator installed")
def test_compose_files_are_valid():
    files = [str(ROOT / "compose.yaml"), *map(str, sorted((ROOT / "deploy").glob("compose*.yaml")))]
    cmd = ["check-jsonschema"] if shutil.which("check-jsonschema") else ["uvx", "check-jsonschema"]
    res = subprocess.run([*cmd, "--builtin-schema", "vendor.compose-spec", *files], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


def test_compose_services_as_local_processes_play_a_game(nats_server, tmp_path):
    hosts = {"nats": "127.0.0.1"}  # container host names → localhost
    nats_port = nats_server.url.rsplit(":", 1)[1]
    procs: dict[str, subprocess.Popen] = {}
    for name, svc in compose_services().items():
        env = {k: expand(str(v), {}) for k, v in (svc.get("environment") or {}).items()}
        env["POPULACE_NATS_URL"] = env["POPULACE_NATS_URL"].replace("nats:4222", f"{hosts['nats']}:{nats_port}")
        env["OTEL_TRACES_EXPORTER"] = "none"  # no Jaeger here
        # one network namespace for all of them, so not compose's one port each; and not a number
        # from free_port either: another process took one before its service bound it (a start
        # that failed the test). Metrics are scraped in test_metrics_scrape, not here: off.
        env["POPULACE_METRICS_PORT"] = "0"
        if "POPULACE_DB" in env:  # the recorder's /data volume
            env["POPULACE_DB"] = str(tmp_path / Path(env["POPULACE_DB"]).name)
        env["POPULACE_STORAGE"] = "memory"
        args = (svc.get("entrypoint") or entrypoint()) + svc.get("command", [])
        assert args[0] == "populace"
        log = open(tmp_path / f"{name}.log", "wb")
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "populace.cli", *args[1:]],
            env={**os.environ, **env, "POPULACE_PARENT_PID": str(os.getpid())}, stdout=log, stderr=log)
    try:
        stack = Stack(hosts=1, nats_url=nats_server.url)  # only to wait for the registrations
        asyncio.run(stack.wait_ready(timeout=90))

        async def go():
            nc = await bus.connect(nats_server.url, "compose-test")
            try:
                return await play(nc, RunConfig.model_validate({"agents": 300, "rounds": 2,
                                                                "model": {"latency_s": 0}}), stall_s=120)
            finally:
                await nc.close()

        out = asyncio.run(go())
    finally:
        for p in procs.values():
            terminate(p, 15)
    assert out.status == "completed", out.reason
    assert out.recorded is not None and out.recorded.outcomes == 600
    assert out.recorded.db_path == str(tmp_path / "populace.duckdb")
