"""deploy/AUTH.md's table of who may publish, subscribe and call which API is deploy/nats/auth.conf's
grants, rendered (populace.core.authconf): the two cannot drift. And the rules the grants keep."""

from __future__ import annotations

import re
from pathlib import Path

from populace.core import authconf

ROOT = Path(__file__).resolve().parents[2]
CONF = (ROOT / "deploy" / "nats" / "auth.conf").read_text()
DOC = (ROOT / "deploy" / "AUTH.md").read_text()
USERS = authconf.users(CONF)


def test_auth_md_has_the_table_of_every_grant_in_auth_conf():
    begin, end = DOC.find(authconf.TABLE_BEGIN), DOC.find(authconf.TABLE_END)
    assert 0 <= begin < end, "deploy/AUTH.md has no generated grants table"
    in_doc = DOC[begin:end + len(authconf.TABLE_END)]
    assert in_doc == authconf.table(CONF), (
        "deploy/AUTH.md's grants table is not deploy/nats/auth.conf's: replace it with the output of "
        "`uv run python -m populace.core.authconf deploy/nats/auth.conf`")


def test_the_table_shows_each_grant_once():
    for user in USERS.values():
        row = authconf.row(user)
        shown = len(re.findall(r"`[^`]+`", row)) - 1  # less the user's name
        assert shown == len(user.publish) + len(user.subscribe) + len(user.publish_deny) + len(user.subscribe_deny)


def test_the_config_is_parsed_as_the_server_reads_it():
    assert list(USERS) == ["orchestrator", "agent-host", "environment", "gateway", "recorder", "replicas", "node",
                           "cli", "manager", "admin"]
    assert USERS["admin"].publish == (">",) and USERS["admin"].subscribe == (">",)
    assert "llm.infer.* gateway" in USERS["gateway"].subscribe  # a queue group keeps its space
    parsed = authconf.parse('a { b: [ "x", y ], c = "q # not a comment" } # a comment\n// another\nd e')
    assert parsed == {"a": {"b": ["x", "y"], "c": "q # not a comment"}, "d": "e"}


def test_the_shared_host_user_is_denied_every_service_durable_on_run():
    """Its mail consumer's name is a wildcard, which would match a service's durable."""
    on_run = {m.group(1) for u in USERS.values() if u.name != "agent-host" for s in u.publish
              if (m := re.fullmatch(r"\$JS\.API\.CONSUMER\.INFO\.RUN\.([^.*>]+)", s))}
    assert on_run == {"orchestrator-spawned", "orchestrator-result", "orchestrator-fault", "environment-open",
                      "environment-partial", "recorder"}
    denied = set(USERS["agent-host"].publish_deny)
    for d in on_run:
        assert {f"$JS.API.CONSUMER.*.RUN.{d}", f"$JS.API.CONSUMER.*.RUN.{d}.>",
                f"$JS.API.CONSUMER.MSG.NEXT.RUN.{d}"} <= denied, d


def test_nobody_but_admin_deletes_or_updates_streams_and_purges_are_few():
    purges = {}
    for u in USERS.values():
        if u.name == "admin":
            continue
        assert not [s for s in u.publish if re.match(r"\$JS\.API\.STREAM\.(DELETE|UPDATE)", s)], u.name
        purges[u.name] = sorted(s.rsplit(".", 1)[1] for s in u.publish if s.startswith("$JS.API.STREAM.PURGE."))
        # a durable's owner may delete it, a host its own mail consumer: no other name
        own = {s.split(".")[-1] for s in u.publish if s.startswith("$JS.API.CONSUMER.INFO.")}
        for s in u.publish:
            if s.startswith("$JS.API.CONSUMER.DELETE."):
                assert s.split(".")[-1] in own, (u.name, s)
    assert {u: p for u, p in purges.items() if p} == {
        "recorder": ["OBJ_checkpoints", "OBJ_snapshots", "RUN"],
        "cli": ["OBJ_graphs", "OBJ_personas", "OBJ_snapshots"],
        "manager": ["OBJ_graphs", "OBJ_personas", "OBJ_snapshots"]}


def test_each_service_writes_only_its_own_liveness_entry():
    for u in USERS.values():
        keys = [s for s in u.publish if s.startswith("$KV.services.")]
        if u.name in ("admin",):
            continue
        assert keys in ([], [f"$KV.services.{u.name}.*"]), (u.name, keys)


def test_only_the_managers_live_pages_keep_a_consumer_on_a_kv_bucket():
    """A registry or run-state list is one stream-info request (bus.bucket_keys): only a watcher
    (the manager's live runs and nodes pages) needs a consumer on a bucket."""
    watching = {u.name: sorted({s.split(".")[4] for s in u.publish
                                if re.match(r"\$JS\.API\.CONSUMER\.(CREATE|INFO)\.KV_", s)} |
                               {s.split(".")[2] for s in u.publish if s.startswith("$JS.FC.KV_")})
                for u in USERS.values() if u.name != "admin"}
    assert {name: kv for name, kv in watching.items() if kv} == {"manager": ["KV_nodes", "KV_runs"]}
