"""The node daemon's pure parts: restart decisions, log tails, GPU listing, how each kind of
process is launched, and the request envelopes' validation."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from populace.core import subjects
from populace.core.contracts import (
    GONE_AFTER_BEATS,
    NODE_REQUESTS,
    AgentHostSpec,
    GatewaySpec,
    NodeInfo,
    ProcessSpec,
    ReplicasSpec,
    RestartPolicy,
    ServiceSpec,
    StartProcess,
    StopProcess,
    TailLog,
)
from populace.node import commands
from populace.node.logtail import tail
from populace.node.policy import STABLE_AFTER_S, after_exit, backoff
from populace.node.resources import default_node_id, parse_nvidia_smi

ON_FAILURE = RestartPolicy(mode="on-failure", max_restarts=2, backoff_s=1.0)


# --- restart policy ---------------------------------------------------------------------
def test_never_leaves_a_dead_child_exited():
    decided = after_exit(RestartPolicy(), exit_code=1, restarts=0, ran_s=1.0)
    assert (decided.state, decided.delay_s) == ("exited", None)


def test_on_failure_restarts_after_a_doubling_backoff_until_the_max():
    first = after_exit(ON_FAILURE, exit_code=-9, restarts=0, ran_s=1.0)
    assert (first.state, first.restarts, first.delay_s) == ("restarting", 1, 1.0)
    second = after_exit(ON_FAILURE, exit_code=1, restarts=1, ran_s=1.0)
    assert (second.state, second.restarts, second.delay_s) == ("restarting", 2, 2.0)
    assert after_exit(ON_FAILURE, exit_code=1, restarts=2, ran_s=1.0).state == "exited"


def test_a_clean_exit_or_a_requested_stop_is_never_restarted():
    assert after_exit(ON_FAILURE, exit_code=0, restarts=0, ran_s=1.0).state == "exited"
    assert after_exit(ON_FAILURE, exit_code=-15, restarts=0, ran_s=1.0, stop_requested=True).state == "stopped"


def test_a_child_that_ran_long_enough_starts_its_restarts_again():
    decided = after_exit(ON_FAILURE, exit_code=1, restarts=2, ran_s=STABLE_AFTER_S)
    assert (decided.state, decided.restarts) == ("restarting", 1)


def test_backoff_is_capped():
    policy = RestartPolicy(mode="on-failure", max_restarts=100, backoff_s=10)
    assert backoff(policy, 0) == 10
    assert backoff(policy, 50) == RestartPolicy.MAX_BACKOFF_S


# --- log tail ---------------------------------------------------------------------------
def test_tail_gives_the_last_lines(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert tail(log, 3, 10_000) == ("line 97\nline 98\nline 99", True)
    assert tail(log, 1000, 10_000)[1] is False


def test_tail_is_bounded_in_bytes_and_drops_the_cut_line(tmp_path):
    log = tmp_path / "x.log"
    log.write_bytes(b"a" * 5000 + b"\nshort\nlast\n")
    text, cut = tail(log, 50, 20)
    assert (text, cut) == ("short\nlast", True)


def test_tail_of_a_missing_or_binary_log(tmp_path):
    assert tail(tmp_path / "none.log", 5, 100) == ("", False)
    (tmp_path / "b.log").write_bytes(b"\xff\xfe ok\n")
    assert "ok" in tail(tmp_path / "b.log", 5, 100)[0]


# --- resources --------------------------------------------------------------------------
def test_nvidia_smi_output_is_parsed_and_junk_skipped():
    gpus = parse_nvidia_smi("0, NVIDIA A100-SXM4-80GB, 81920\n1, NVIDIA L4, 23034\nNo devices were found\n")
    assert [(g.index, g.name, g.memory_mb) for g in gpus] == [(0, "NVIDIA A100-SXM4-80GB", 81920),
                                                             (1, "NVIDIA L4", 23034)]


def test_default_node_id_is_one_subject_token():
    assert subjects.valid_token(default_node_id())


# --- launching --------------------------------------------------------------------------
ENV = {"PATH": "/bin", "POPULACE_NATS_USER": "node", "POPULACE_NATS_PASSWORD": "node-secret",
       "POPULACE_PASSWORD_AGENT_HOST": "host-secret", "POPULACE_PASSWORD_GATEWAY": "gw-secret",
       "POPULACE_METRICS_PORT": "9100", "POPULACE_LOG_LEVEL": "DEBUG"}


def launch(spec, with_users=False, environ=ENV):
    return commands.launch(spec, proc_id="agent-host-3", node_id="n1", nats_url="nats://x:4222", node_pid=42,
                           services=["agent-host", "gateway", "recorder"], environ=environ, with_users=with_users)


def test_an_agent_host_gets_its_id_settings_and_the_node_as_parent():
    how = launch(AgentHostSpec(max_in_flight=500, capacity=1000))
    assert how.argv[1:] == ["-m", "populace.core.serve", "agent-host"]
    env = how.env
    assert env["POPULACE_HOST_ID"] == "n1-agent-host-3"
    assert (env["POPULACE_MAX_IN_FLIGHT"], env["POPULACE_HOST_CAPACITY"]) == ("500", "1000")
    assert (env["POPULACE_PARENT_PID"], env["POPULACE_NATS_URL"], env["POPULACE_METRICS_PORT"]) == (
        "42", "nats://x:4222", "0")
    assert env["POPULACE_LOG_LEVEL"] == "DEBUG"  # the rest of the node's environment is inherited


def test_no_child_sees_the_nodes_credentials_or_other_users_passwords():
    env = launch(GatewaySpec(router="round-robin"), with_users=True).env
    assert (env["POPULACE_NATS_USER"], env["POPULACE_NATS_PASSWORD"]) == ("gateway", "gw-secret")
    assert not any(k.startswith(commands.PASSWORD_PREFIX) for k in env)
    assert "node-secret" not in env.values() and "host-secret" not in env.values()
    without_users = launch(GatewaySpec()).env
    assert "POPULACE_NATS_USER" not in without_users and "POPULACE_NATS_PASSWORD" not in without_users


def test_a_child_whose_user_has_no_password_is_refused():
    with pytest.raises(commands.Refusal, match="POPULACE_PASSWORD_RECORDER"):
        launch(ServiceSpec(name="recorder"), with_users=True)


def test_a_service_that_is_not_installed_is_refused_by_name():
    with pytest.raises(commands.UnknownProcess, match="'nosuch' is not installed"):
        launch(ServiceSpec(name="nosuch"))


def test_replicas_run_the_replicas_command_with_their_options():
    sim = launch(ReplicasSpec(backend="sim", servers=3, max_concurrency=8)).argv
    assert sim[1:] == ["-m", "populace.cli", "replicas", "sim", "--nats", "nats://x:4222", "--max-concurrency", "8",
                       "--count", "3"]
    vllm = launch(ReplicasSpec(backend="vllm", model="Qwen/Qwen2.5-0.5B", gpus=[0, 1], base_port=8100)).argv
    assert vllm[vllm.index("--gpus") + 1] == "0,1" and "--count" not in vllm
    assert vllm[vllm.index("--model") + 1] == "Qwen/Qwen2.5-0.5B"


# --- envelopes --------------------------------------------------------------------------
def test_every_request_verb_has_its_subject():
    assert tuple(r.VERB for r in NODE_REQUESTS) == subjects.NODE_VERBS
    assert subjects.node_request("n1", "start", "cli") == "node.n1.start.cli"
    assert subjects.node_request("n1", "start") == "node.n1.start.*"  # what the node subscribes to
    assert not subjects.node_request("n1", "start").startswith(tuple(s.rstrip(">") for s in subjects.CTL_SUBJECTS))


def test_an_unknown_kind_of_process_is_refused_by_name():
    with pytest.raises(ValidationError, match="'rm -rf'"):
        StartProcess.model_validate_json('{"spec": {"kind": "rm -rf"}}')


@pytest.mark.parametrize("body", [
    '{"spec": {"kind": "agent-host", "env": {"LD_PRELOAD": "x"}}}',  # no raw environment
    '{"spec": {"kind": "agent-host"}, "count": 1000}',
    '{"spec": {"kind": "service", "name": "../../bin/sh"}}',
    '{"spec": {"kind": "replicas", "backend": "vllm"}}',  # vllm needs a model
    '{"spec": {"kind": "replicas", "backend": "sim", "model": "x"}}',
    '{"spec": {"kind": "replicas", "bind": "0.0.0.0 --evil"}}',
    '{"spec": {"kind": "gateway"}, "restart": {"mode": "always"}}',
])
def test_malformed_start_requests_are_refused(body):
    with pytest.raises(ValidationError):
        StartProcess.model_validate_json(body)


def test_process_ids_are_tokens_and_tails_are_bounded():
    with pytest.raises(ValidationError):
        StopProcess(proc_id="a.b")
    with pytest.raises(ValidationError):
        TailLog(proc_id="agent-host-1", max_bytes=10**9)


def test_specs_round_trip_through_the_union():
    for spec in (AgentHostSpec(capacity=5), GatewaySpec(), ReplicasSpec(backend="local", threads=2),
                 ServiceSpec(name="recorder")):
        assert TypeAdapter(ProcessSpec).validate_json(spec.model_dump_json()) == spec


def test_a_node_is_gone_after_missed_heartbeats():
    node = NodeInfo(node_id="n1", hostname="h", pid=1, version="0", cpus=1, memory_bytes=0,
                    memory_available_bytes=0, log_dir="/tmp", started_at=0.0, heartbeat_at=100.0, heartbeat_s=2.0)
    assert not node.gone(now=100.0 + GONE_AFTER_BEATS * 2.0)
    assert node.gone(now=100.1 + GONE_AFTER_BEATS * 2.0)
