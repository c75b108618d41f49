"""One NATS user per agent-host, derived from the deploy file's shared agent-host user."""

from __future__ import annotations

from pathlib import Path

import pytest

from populace.core.hostauth import HostAuthError, host_user, with_hosts

CONF = (Path(__file__).resolve().parents[2] / "deploy" / "nats" / "auth.conf").read_text()


def test_a_hosts_user_publishes_and_reads_only_its_own_subjects():
    block = host_user(CONF, "node-7", "s3cret")
    assert 'user: "node-7"' in block and 'password: "s3cret"' in block and "AGENT_HOST_PASSWORD" not in block
    for own in ('"run.*.outcomes.*.node-7"', '"run.*.partial.*.node-7.*"', '"run.*.spawned.node-7"',
                '"run.*.fault.node-7"', '"progress.*.*.node-7"', '"$KV.hosts.node-7"', '"_INBOX_node-7.>"',
                '"run.*.spawn.node-7"', '"llm.infer.node-7"', '"reply.gateway.node-7.>"'):
        assert own in block
    for shared in ('"run.*.outcomes.*.*"', '"run.*.partial.*.*.*"', '"_INBOX_agent-host.>"', '"$KV.hosts.>"',
                   '"run.*.spawn.*"', '"llm.infer.agent-host"', '"reply.gateway.agent-host.>"', "llm.infer\"",
                   "allow_responses"):
        assert shared not in block


def test_hosts_are_added_after_the_shared_user_which_stays():
    conf = with_hosts(CONF, {"h-a": "pa", "h-b": "pb"})
    assert conf.count("user: agent-host") == 1 and conf.count('user: "h-a"') == 1 and conf.count('user: "h-b"') == 1
    assert conf.index("user: agent-host") < conf.index('user: "h-a"') < conf.index("user: environment")


@pytest.mark.parametrize("host_id, password, error", [
    ("a.b", "p", "letters, digits"), ("a b", "p", "letters, digits"), ("h", 'p"q', "without quotes"),
    ("h", "", "non-empty"), ("environment", "p", "name of a user"), ("agent-host", "p", "name of a user")])
def test_bad_ids_and_passwords_are_refused(host_id, password, error):
    with pytest.raises(HostAuthError, match=error):
        host_user(CONF, host_id, password)


def test_a_config_whose_agent_host_block_changed_shape_fails_loudly():
    with pytest.raises(HostAuthError, match=r'0 × "run.\*.outcomes.\*.\*"'):
        host_user(CONF.replace('"run.*.outcomes.*.*"', '"run.>"'), "h", "p")
    with pytest.raises(HostAuthError, match="no `user: agent-host` block"):
        host_user("authorization { users = [] }", "h", "p")
