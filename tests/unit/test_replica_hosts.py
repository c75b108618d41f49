"""Which registered replicas may be called (populace.core.replica_hosts) and a replica set's own NATS
user (populace.core.replicaauth): pure rules, no broker. What the server and the gateway do with
them is in tests/integration/test_replica_grants.py and tests/e2e/test_replica_hijack_e2e.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from populace.core import authconf, replica_hosts, replicaauth, subjects
from populace.core.contracts import ReplicaInfo
from populace.core.settings import Settings

AUTH_CONF = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "auth.conf"
DEFAULT = replica_hosts.parse(Settings().replica_hosts)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://127.5.6.7:1", "http://localhost:9",
                                 "http://[::1]:8000", "https://localhost", "http://127.0.0.1:8000/v2"])
def test_loopback_is_allowed_by_default(url):
    assert DEFAULT.refusal(url, "replicas") is None


@pytest.mark.parametrize("url,says", [
    ("http://203.0.113.7:8000", "203.0.113.7:8000 registered by replicas is not in POPULACE_REPLICA_HOSTS"),
    ("http://evil.example:80", "evil.example:80 registered by replicas is not in"),
    ("http://127.1:8000", "127.1:8000"),  # not an address as written: a name, and not one listed
    ("http://2130706433:8000", "2130706433:8000"),
    ("http://[::ffff:127.0.0.1]:8000", "::ffff:127.0.0.1"),  # IPv6, not in 127.0.0.0/8
    ("http://127.0.0.1:8000@evil.example", "is not http(s)://host[:port][/path]"),
    ("http://evil.example#@127.0.0.1:8000", "is not http(s)://host[:port][/path]"),
    ("http://127.0.0.1:8000?x=1", "is not http(s)://"),
    ("http://127.0.0.1:8000/%2e%2e", "is not http(s)://"),
    ("ftp://127.0.0.1", "is not http(s)://"),
    ("http://127.0.0.1 :8000", "is not http(s)://"),
    ("http://127.0.0.1\\@evil.example", "is not http(s)://"),
])
def test_anything_else_is_refused_naming_the_host_and_the_setting(url, says):
    assert says in (DEFAULT.refusal(url, "replicas") or "")


def test_items_bind_writers_ports_and_networks():
    hosts = replica_hosts.parse("10.0.0.0/24, replicas-gpu@10.0.1.5:8000, llama, fd00::/8, [fe80::1]:7")
    assert hosts.refusal("http://10.0.0.200:1234", "anyone") is None
    assert hosts.refusal("http://10.0.1.5:8000", "replicas-gpu") is None
    assert "10.0.1.5:8000 registered by replicas is not" in hosts.refusal("http://10.0.1.5:8000", "replicas")
    assert hosts.refusal("http://10.0.1.5:8001", "replicas-gpu") is not None  # another port
    assert hosts.refusal("http://llama:8080", "replicas") is None and hosts.refusal("http://LLAMA:1", None) is None
    assert hosts.refusal("http://llama.evil.example:8080", "replicas") is not None  # names match whole
    assert hosts.refusal("http://[fd00::5]:80", "r") is None and hosts.refusal("http://[fe80::1]:7", "r") is None
    assert hosts.refusal("http://[fe80::1]:8", "r") is not None
    assert replica_hosts.parse("*").refusal("http://anywhere.example:1", "r") is None
    assert replica_hosts.parse("*").refusal("http://x@anywhere.example", "r") is not None  # still a plain URL


@pytest.mark.parametrize("spec,says", [
    ("a b", "'a b'"), ("10.0.0.0/33", "is neither a network"), ("a@@b", "the writer before @"),
    ("host:99999", "is not host[:port]"), ("http://x", "nor host[:port]"), ("under_score", "is not a host name"),
])
def test_a_bad_allow_list_is_refused_naming_the_setting_and_the_item(spec, says):
    with pytest.raises(ValueError, match="POPULACE_REPLICA_HOSTS") as err:
        replica_hosts.parse(spec)
    assert says in str(err.value)
    with pytest.raises(ValueError, match="replica_hosts"):  # every service refuses to start with it
        Settings(replica_hosts=spec)


def test_a_key_names_its_writer_and_its_replica():
    assert subjects.replica_key("replicas-gpu", "vllm-0") == "replicas-gpu.vllm-0"
    assert subjects.replica_key_parts("replicas-gpu.vllm-0") == ("replicas-gpu", "vllm-0")
    assert subjects.replica_key_parts("vllm-0") is None  # an older Populace's key: no writer
    url = "http://127.0.0.1:8000"
    assert replica_hosts.entry_refusal("replicas.sim-0", "sim-0", url, DEFAULT) is None
    assert "names replica 'sim-0', its entry 'sim-1'" in replica_hosts.entry_refusal("replicas.sim-0", "sim-1", url,
                                                                                     DEFAULT)
    assert "is not <writer>.<replica id>" in replica_hosts.entry_refusal("sim-0", "sim-0", url, DEFAULT)
    bound = replica_hosts.parse("replicas-main@127.0.0.1")
    assert replica_hosts.entry_refusal("replicas-main.sim-0", "sim-0", url, bound) is None
    assert "registered by replicas is not" in replica_hosts.entry_refusal("replicas.sim-0", "sim-0", url, bound)


def test_readers_count_bound_entries_each_named_by_its_key():
    def info(rid: str) -> ReplicaInfo:
        return ReplicaInfo(replica_id=rid, url="http://127.0.0.1:1", backend="sim", kind="sim", model="m",
                           heartbeat_at=time.time())

    items = [("replicas.a", info("a")), ("replicas-gpu.a", info("a")), ("b", info("b")), ("replicas.c", info("x"))]
    assert [r.replica_id for r in replica_hosts.bound(items)] == ["replicas.a", "replicas-gpu.a"]


def test_where_replicas_advertise_is_checked_before_they_start():
    fleet = replica_hosts.parse("10.0.0.0/24,replicas-gpu@10.0.1.5:8000")
    assert fleet.advertise_refusal("10.0.0.9", "replicas", None) is None
    assert "10.0.1.5 (on ports picked when they start)" in fleet.advertise_refusal("10.0.1.5", "replicas-gpu", None)
    assert fleet.advertise_refusal("10.0.1.5", "replicas-gpu", [8000]) is None
    assert "10.0.1.5:8000,8001" in fleet.advertise_refusal("10.0.1.5", "replicas-gpu", [8000, 8001])
    assert DEFAULT.advertise_refusal("127.0.0.1", "replicas", None) is None
    assert DEFAULT.advertise_refusal("[::1]", "replicas", None) is None


# --- a replica set's own user -----------------------------------------------------------------

def test_a_replica_sets_user_writes_only_its_own_keys_and_reads_only_its_inbox():
    conf = AUTH_CONF.read_text()
    shared = authconf.users(conf)["replicas"]
    assert [s for s in shared.publish if s.startswith("$KV.")] == ["$KV.replicas.replicas.>"]
    block = replicaauth.set_user(conf, "gpu", "pw")
    own = authconf.users(f"authorization {{ users = [ {block} ] }}")["replicas-gpu"]
    assert [s for s in own.publish if s.startswith("$KV.")] == ["$KV.replicas.replicas-gpu.>"]
    assert own.subscribe == ("_INBOX_replicas-gpu.>",)
    assert set(own.publish) - {"$KV.replicas.replicas-gpu.>"} == set(shared.publish) - {"$KV.replicas.replicas.>"}
    both = replicaauth.with_sets(conf, {"gpu": "pw1", "cpu": "pw2"})
    assert {"replicas", "replicas-gpu", "replicas-cpu"} <= set(authconf.users(both))


@pytest.mark.parametrize("name,says", [("a.b", "letters, digits"), ("", "letters, digits"), ("x" * 41, "1 to 40")])
def test_a_replica_set_name_is_one_plain_token(name, says):
    with pytest.raises(replicaauth.ReplicaAuthError, match=says):
        replicaauth.set_user(AUTH_CONF.read_text(), name, "pw")


def test_a_replica_set_cannot_take_an_existing_users_name():
    conf = replicaauth.with_sets(AUTH_CONF.read_text(), {"gpu": "pw"})
    with pytest.raises(replicaauth.ReplicaAuthError, match="'replicas-gpu' is the name of a user"):
        replicaauth.set_user(conf, "gpu", "pw")
