"""compose.yaml's `manager` profile: the manager and a node run the image's `populace`, with
command lines the real CLI accepts; the manager listens where its published port points, takes
its token from the environment (never from the file), and its healthcheck needs no token."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main
import yaml

from populace.cli.main import app as cli
from populace.manager.access import OPEN_PATHS, TOKEN_ENV

ROOT = Path(__file__).resolve().parents[2]


def services() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]


def parsed(svc: dict) -> dict:
    """The options `populace <entrypoint[1]> <command>` gets, parsed by the CLI itself."""
    program, verb = svc["entrypoint"]
    assert program == "populace"
    command = typer.main.get_command(cli).commands[verb]  # type: ignore[attr-defined]
    return command.make_context(verb, list(svc["command"])).params


def seconds(duration: str) -> float:
    value, unit = re.fullmatch(r"(\d+)(s|m)", duration).groups()
    return float(value) * (60 if unit == "m" else 1)


def test_the_manager_profile_runs_the_manager_and_a_node_from_the_populace_image():
    all_services = services()
    manager, node = all_services["manager"], all_services["node"]
    for svc in (manager, node):
        assert svc["profiles"] == ["manager"]
        assert svc["image"] == all_services["orchestrator"]["image"]
        assert svc["depends_on"]["nats"]["condition"] == "service_healthy"
    assert parsed(node)["nats"] == "nats://nats:4222"
    # the node's processes stop (SIGTERM, then SIGKILL after --stop-grace) before compose kills it
    assert seconds(node["stop_grace_period"]) > parsed(node)["stop_grace"]


def test_the_manager_listens_on_its_published_port_and_asks_for_a_token_from_the_environment():
    manager = services()["manager"]
    params = parsed(manager)
    assert params["host"] == "0.0.0.0" and params["nats"] == "nats://nats:4222"
    published = [p.rsplit(":", 1) for p in manager["ports"]]
    assert [int(container) for _, container in published] == [params["port"]] == [8080]
    assert all(p.startswith("127.0.0.1:") for p in manager["ports"])
    # the token comes from the operator's environment, never from the file
    assert manager["environment"][TOKEN_ENV] == "${" + TOKEN_ENV + ":-}"
    # the healthcheck reads the one path that needs no token, on the manager's port
    probe = " ".join(manager["healthcheck"]["test"])
    path = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", probe)
    assert int(path[1]) == params["port"] and path[2] in OPEN_PATHS
