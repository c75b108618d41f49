"""A one-process stack (`Stack(one_process=True)`, `python -m populace.core.serve --together`)
without starting one: each service gets the settings its own process would have had; what needs
a process per service is a StackError naming why; what a process held once per service (run
configs, the service on log lines, the tracer provider) stays per service. That a run on it
records what a process-per-service stack records is tests/e2e/test_game_e2e.py's last test."""

from __future__ import annotations

import asyncio
import json

import pytest
import structlog

from populace.client.stack import Stack, StackError, service_keys, settings_of
from populace.core import runconfigs, serve, telemetry
from populace.core.contracts import RunConfig
from populace.core.metrics import MetricsPortUnavailable
from populace.core.settings import Settings


def test_each_service_gets_the_settings_its_own_process_would_have_had():
    users = {u: f"pw-{u}" for u in ("orchestrator", "environment", "gateway", "recorder", "agent-host", "host-1")}
    stack = Stack(hosts=2, users=users, one_process=True, host_env={"POPULACE_HOST_CAPACITY": "400"})
    specs = stack._together(service_keys(2))
    assert [name for name, _ in specs] == ["orchestrator", "environment", "gateway", "recorder", "agent-host",
                                           "agent-host"]
    assert specs[0][1] == {"nats_user": "orchestrator", "nats_password": "pw-orchestrator"}
    # host-0 has no user of its own: the shared one; host-1 has its own (populace.core.hostauth)
    assert specs[4][1] == {"host_id": "host-0", "nats_user": "agent-host", "nats_password": "pw-agent-host",
                           "host_capacity": "400"}
    assert specs[5][1]["host_id"] == "host-1" and specs[5][1]["nats_user"] == "host-1"
    # what the child reads back: its own settings over the environment's
    settings = Settings(**specs[5][1])
    assert (settings.host_id, settings.nats_user, settings.host_capacity) == ("host-1", "host-1", 400)
    assert serve.together_specs(json.dumps(specs)) == specs


def test_a_variable_that_is_no_setting_cannot_go_to_one_service_of_a_shared_process():
    assert settings_of({"POPULACE_HOST_ID": "h"}, "host") == {"host_id": "h"}
    with pytest.raises(StackError, match=r"host_env: LD_PRELOAD cannot be set for one service of a one-process"):
        Stack(hosts=1, one_process=True, host_env={"LD_PRELOAD": "x"})._together(service_keys(1))


def test_a_one_process_stack_refuses_per_service_metrics_before_anything_starts(tmp_path):
    stack = Stack(hosts=1, one_process=True, metrics=True, db=str(tmp_path / "x.duckdb"), log_dir=str(tmp_path))
    with pytest.raises(StackError, match=r"no per-service /metrics \(its services share one Prometheus registry\)"):
        stack.start()
    assert stack.nats is None and stack.procs == {}
    with pytest.raises(MetricsPortUnavailable, match=r"orchestrator, gateway each have a metrics port"):
        serve.metrics_owner([("orchestrator", {"metrics_port": 9100}), ("environment", {}),
                             ("gateway", {"metrics_port": "9101"})])
    serve.metrics_owner([("orchestrator", {"metrics_port": 9100}), ("gateway", {})])  # one port serves all


@pytest.mark.parametrize("operation", [
    lambda s: s.kill("agent-host-0"), lambda s: s.restart("orchestrator"), lambda s: s.log_tail("recorder"),
])
def test_what_needs_a_process_per_service_is_a_stack_error_never_done_to_the_whole_process(operation):
    stack = Stack(hosts=1, one_process=True)
    with pytest.raises(StackError, match=r"shares the one process of this stack with every service"):
        operation(stack)
    with pytest.raises(StackError, match=r"no rss per service"):
        stack.rss_by_process()
    assert stack.rss_bytes() == 0  # the whole stack's memory still adds up (nothing runs here)


def test_services_named_apart_keep_their_own_process_and_leave_the_shared_one():
    users = {u: f"pw-{u}" for u in ("orchestrator", "environment", "gateway", "recorder", "agent-host", "host-1")}
    stack = Stack(hosts=2, users=users, one_process=True, apart=("environment", "agent-host-1"))
    keys = service_keys(2)
    own = stack._apart(keys)
    assert own == ["environment", "agent-host-1"]
    shared = stack._together([key for key in keys if key not in own])
    assert [(name, settings.get("host_id")) for name, settings in shared] == [
        ("orchestrator", None), ("gateway", None), ("recorder", None), ("agent-host", "host-0")]
    # what it is spawned with: the settings its own process of a process-per-service stack gets
    spawned = {}
    stack._spawn = lambda key, args, env, service=False: spawned.setdefault(key, (args, env))  # no process here
    stack._spawn_each(own, {"BASE": "1"})
    assert spawned["environment"] == (["-m", "populace.core.serve", "environment"],
                                      {"BASE": "1", "POPULACE_NATS_USER": "environment",
                                       "POPULACE_NATS_PASSWORD": "pw-environment"})
    assert spawned["agent-host-1"][1] == {"BASE": "1", "POPULACE_HOST_ID": "host-1", "POPULACE_NATS_USER": "host-1",
                                          "POPULACE_NATS_PASSWORD": "pw-host-1"}
    # a variable that is no setting may go to a host that has its own process, not to a shared one
    Stack(hosts=1, one_process=True, apart=("agent-host-0",), host_env={"LD_PRELOAD": "x"})._together(
        ["orchestrator", "environment", "gateway", "recorder"])


@pytest.mark.parametrize(("settings", "message"), [
    ({"one_process": True, "apart": ("agent-host-2",)}, r"apart: agent-host-2 is no service of this stack"),
    ({"apart": ("environment",)}, r"set one_process=True with it"),
])
def test_apart_names_services_of_a_one_process_stack_before_anything_starts(tmp_path, settings, message):
    stack = Stack(hosts=2, db=str(tmp_path / "x.duckdb"), log_dir=str(tmp_path), **settings)
    with pytest.raises(StackError, match=message):
        stack.start()
    assert stack.nats is None and stack.procs == {}


def test_the_together_variable_is_checked():
    with pytest.raises(ValueError, match=r"POPULACE_TOGETHER is not a JSON list"):
        serve.together_specs("{oops")
    with pytest.raises(ValueError, match=r"unknown services \['nope'\]"):
        serve.together_specs(json.dumps([["orchestrator", {}], ["nope", {}]]))
    with pytest.raises(ValueError, match=r"unknown services \(none given\)"):
        serve.together_specs("[]")


def test_each_service_in_a_shared_process_keeps_its_own_run_configs_and_log_name():
    config = RunConfig.model_validate({"agents": 10, "rounds": 1})
    orchestrator, environment = serve.own_context("orchestrator"), serve.own_context("environment")
    orchestrator.run(runconfigs.CACHE.put, "r1", "d1", config)
    assert orchestrator.run(runconfigs.CACHE.get, "r1", "d1") is config
    # the environment tells a resumed run's new config by not having it yet: another's put must not hide it
    assert environment.run(runconfigs.CACHE.get, "r1", "d1") is None
    assert runconfigs.CACHE.get("r1", "d1") is None  # nor the process's own cache (one service per process)
    service = {ctx.run(structlog.contextvars.get_contextvars).get("service") for ctx in (orchestrator, environment)}
    assert service == {"orchestrator", "environment"}

    async def handler():  # a task the service starts: its context's copy, as serve.run_together starts it
        return await asyncio.create_task(asyncio.sleep(0, runconfigs.CACHE.get("r1", "d1")))

    async def started_in(ctx):
        return await asyncio.create_task(handler(), context=ctx)

    assert asyncio.run(started_in(orchestrator)) is config
    assert asyncio.run(started_in(environment)) is None


def test_tracing_is_shut_down_when_the_last_service_of_the_process_stops(monkeypatch):
    class Provider:
        shutdowns = 0

        def shutdown(self):
            self.shutdowns += 1

    provider = Provider()
    monkeypatch.setattr(telemetry, "_provider", provider)
    monkeypatch.setattr(telemetry, "_services", 0)
    telemetry.setup("orchestrator")
    telemetry.setup("gateway")
    telemetry.shutdown()
    assert provider.shutdowns == 0  # the gateway still traces
    telemetry.shutdown()
    assert provider.shutdowns == 1
