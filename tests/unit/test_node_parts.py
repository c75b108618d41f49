"""The node daemon's pure parts: restart decisions, log tails, GPU listing, how each kind of
process is launched, and the request envelopes' validation."""

from __future__ import annotations

import json
import re

import pytest
from pydantic import TypeAdapter, ValidationError

from populace.core import replica_hosts, subjects
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


def launch(spec, with_users=False, environ=ENV, **kw):
    return commands.launch(spec, proc_id="agent-host-3", node_id="n1", nats_url="nats://x:4222", node_pid=42,
                           services=["agent-host", "gateway", "recorder"], environ=environ, with_users=with_users,
                           **kw)


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
    assert sim[1:] == ["-m", "populace.cli", "replicas", "sim", "--nats=nats://x:4222", "--max-concurrency=8",
                       "--count=3"]
    vllm = launch(ReplicasSpec(backend="vllm", model="Qwen/Qwen2.5-0.5B", gpus=[0, 1], base_port=8100)).argv
    assert "--gpus=0,1" in vllm and not any(a.startswith("--count") for a in vllm)
    assert "--model=Qwen/Qwen2.5-0.5B" in vllm  # flag and value one argument: a value is never an option


@pytest.mark.parametrize("model,says", [
    ("--help", "'--help' is an option, not a model"),
    ("--trust-remote-code", "is an option, not a model"),
    ("-x", "is an option, not a model"),
    ("../../../../etc", "climbs directories ('..')"),
    ("/models/../etc", "climbs directories ('..')"),
    ("org/name/extra", "is neither a model id"),
    ("name with space", "is neither a model id"),
    ("hf://x", "is neither a model id"),
])
def test_a_replicas_model_is_a_model_id_or_an_absolute_path_never_an_option(model, says):
    with pytest.raises(ValidationError, match=re.escape(says)):
        ReplicasSpec(backend="vllm", model=model)
    with pytest.raises(ValidationError):  # and a node's request naming it is malformed (dead-lettered)
        StartProcess.model_validate_json(json.dumps({"spec": {"kind": "replicas", "backend": "vllm",
                                                              "model": model}}))


def test_a_model_path_is_served_only_under_the_nodes_model_roots(tmp_path):
    root, outside = tmp_path / "models", tmp_path / "elsewhere"
    (root / "smol").mkdir(parents=True)
    outside.mkdir()
    (root / "escape").symlink_to(outside)  # a link under the root that leads out of it
    spec = ReplicasSpec(backend="vllm", model=str(root / "smol"))
    with pytest.raises(commands.Refusal, match="not under this node's model folders .POPULACE_NODE_MODEL_ROOTS: none"):
        launch(spec)
    assert f"--model={root / 'smol'}" in launch(spec, model_roots=[str(root)]).argv
    with pytest.raises(commands.Refusal, match="not under this node's model folders"):
        launch(ReplicasSpec(backend="vllm", model=str(root / "escape")), model_roots=[str(root)])
    with pytest.raises(commands.Refusal, match="not under"):
        launch(ReplicasSpec(backend="vllm", model=str(outside)), model_roots=[str(root)])


def test_replicas_advertised_outside_the_allow_list_are_refused_before_they_start():
    with pytest.raises(commands.Refusal, match=r"advertise: 203\.0\.113\.7 \(on ports picked when they start\) "
                                               r"registered by replicas is not in POPULACE_REPLICA_HOSTS"):
        launch(ReplicasSpec(backend="sim", advertise="203.0.113.7"))
    with pytest.raises(commands.Refusal, match="evil.example"):
        launch(ReplicasSpec(backend="sim", bind="0.0.0.0", advertise="evil.example"))
    assert launch(ReplicasSpec(backend="sim", bind="0.0.0.0")).argv  # advertised on loopback: allowed
    fleet = replica_hosts.parse("10.0.0.0/24,replicas-gpu@10.0.1.5:8000")
    assert launch(ReplicasSpec(backend="sim", bind="0.0.0.0", advertise="10.0.0.9"), hosts=fleet).argv
    # a host allowed on given ports only: a sim's ports are picked when it starts, a vllm's are known
    with pytest.raises(commands.Refusal, match="10.0.1.5"):
        launch(ReplicasSpec(backend="sim", advertise="10.0.1.5", set="gpu"), hosts=fleet, with_users=True,
               environ={**ENV, "POPULACE_PASSWORD_REPLICAS_GPU": "pw"})
    vllm = ReplicasSpec(backend="vllm", model="org/m", advertise="10.0.1.5", base_port=8000, set="gpu")
    assert launch(vllm, hosts=fleet, with_users=True, environ={**ENV, "POPULACE_PASSWORD_REPLICAS_GPU": "pw"}).argv
    with pytest.raises(commands.Refusal, match="registered by replicas is not"):  # the item is the set's only
        launch(vllm.model_copy(update={"set": None}), hosts=fleet, with_users=True,
               environ={**ENV, "POPULACE_PASSWORD_REPLICAS": "pw"})
    with pytest.raises(ValidationError):  # never an option
        ReplicasSpec(backend="sim", advertise="--help")


def test_a_replica_set_runs_as_its_own_user():
    env = launch(ReplicasSpec(backend="sim", set="gpu"), with_users=True,
                 environ={**ENV, "POPULACE_PASSWORD_REPLICAS_GPU": "set-pw", "POPULACE_PASSWORD_REPLICAS": "shared"}).env
    assert (env["POPULACE_NATS_USER"], env["POPULACE_NATS_PASSWORD"]) == ("replicas-gpu", "set-pw")
    with pytest.raises(commands.Refusal, match="POPULACE_PASSWORD_REPLICAS_GPU"):
        launch(ReplicasSpec(backend="sim", set="gpu"), with_users=True, environ=ENV)


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
