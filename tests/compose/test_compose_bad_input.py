"""Bad input to `docker compose up`: a missing manager token, NATS's port already in use, NATS
not healthy. Each fails `up` with a message naming the variable or the port; without a token
nothing is created, with NATS down no Populace service runs; `down -v` then leaves nothing."""

from __future__ import annotations

import socket

import pytest
from compose_project import new_project

from populace.core.natsserver import free_port

pytestmark = pytest.mark.compose

SERVICES = ("orchestrator", "environment", "gateway", "recorder", "agent-host")
TOKEN = {"POPULACE_MANAGER_TOKEN": "any-token-lets-down-through"}


def assert_no_service_runs(project) -> None:
    states = project.running()
    started = {
        name: state
        for name, state in states.items()
        if state not in ("created", "exited") and not name.endswith(("-nats-1", "-jaeger-1"))
    }
    assert started == {}, states


def test_the_manager_profile_without_a_token_stops_up_naming_the_variable_before_anything_is_created(images):
    project = new_project(images, "populace-badtoken", manager=free_port())
    project.env["POPULACE_MANAGER_PORT"] = str(project.ports["manager"])
    # without the profile no token is needed: `up` of the other services is not affected
    project.compose("config", "--quiet")
    try:
        res = project.compose("--profile", "manager", "up", "-d", "--wait", "--wait-timeout", "120", check=False,
                              timeout=300)
        assert res.returncode != 0
        assert "POPULACE_MANAGER_TOKEN-is-required" in res.stderr, res.stderr[-2000:]
        # compose refused before it created anything: no half-started stack
        assert project.compose("--profile", "manager", "ps", "-a", "-q", extra_env=TOKEN).stdout.split() == []
        assert project.running() == {}
    finally:
        # compose checks the whole project for `down` too: any token lets it through
        project.compose("--profile", "manager", "down", "-v", "--remove-orphans", "--timeout", "20", timeout=180,
                        extra_env=TOKEN)
    assert project.leftovers() == {"containers": [], "volumes": [], "networks": []}


def test_a_nats_port_in_use_stops_up_naming_the_port(images):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        project = new_project(images, "populace-badport", nats=port)
        try:
            res = project.compose("up", "-d", "--wait", "--wait-timeout", "120", check=False, timeout=300)
            assert res.returncode != 0
            assert "nats" in res.stderr, res.stderr[-2000:]
            logs = project.compose("logs", "nats").stdout
            assert str(port) in logs and "address already in use" in logs, logs[-2000:]
            assert_no_service_runs(project)
        finally:
            project.down()
    assert project.leftovers() == {"containers": [], "volumes": [], "networks": []}


def test_nats_not_healthy_stops_up_before_any_service_runs(images):
    project = new_project(images, "populace-badnats")
    # NATS runs, but its health endpoint is never reachable where the healthcheck asks
    project.env["COMPOSE_FILE"] += ":tests/compose/nats-unhealthy.yaml"
    try:
        res = project.compose("up", "-d", "--wait", "--wait-timeout", "120", check=False, timeout=300)
        assert res.returncode != 0
        assert "nats" in res.stderr and "unhealthy" in res.stderr, res.stderr[-2000:]
        assert_no_service_runs(project)
    finally:
        project.down()
    assert project.leftovers() == {"containers": [], "volumes": [], "networks": []}
