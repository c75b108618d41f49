"""A hijacked replica registration is refused (issue 41, attack 7), with users on and real processes.

Before, the `replicas` user could write any key of KV `replicas`, and the gateway called whatever
URL an entry named: an entry for an attacker's server, with the legitimate keys overwritten, got
4,000 chat calls with their prompts (personas, memory) and decided 2,000 of 2,000 outcomes.

Here the stack runs deploy/nats/auth.conf with a replica set of its own, `replicas-main`
(`populace auth replicas main`), whose `populace replicas sim` process registers the only real
replica; the gateway's allow-list names that set (`POPULACE_REPLICA_HOSTS=replicas-main@127.0.0.1`,
as a fleet binds its replica machines). The attacker holds the shared `replicas` credential and runs
a server of its own on loopback. Throughout a 300-agent run on the `sim` backend it:
- overwrites and deletes the legitimate key: refused by the server (its grant is its own keys);
- registers its server under its own key and the legitimate replica's id, and another entry for a
  host outside the list, heartbeating both: the gateway logs each refusal once and never calls them.
Every call of the run is answered by the real replica (llm_calls), its server is never connected
to, every outcome is valid, and the server logs exactly the two refused writes.

Mostly waits: on the stack's start and a short run (one process for the services)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import duckdb
import nats
import nats.errors
import pytest

from populace.client.prepare import prepare
from populace.client.run import new_run_id, play
from populace.core import bus, subjects
from populace.core.contracts import ReplicaInfo, RunConfig
from populace.core.replicaauth import with_sets

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
AUTH_CONF = ROOT / "deploy" / "nats" / "auth.conf"
USERS = ("orchestrator", "environment", "gateway", "recorder", "agent-host", "replicas", "node", "cli", "manager",
         "admin")
SET, SET_USER = "main", "replicas-main"
SCENARIO = {"agents": 300, "rounds": 2, "seed": 3, "model": {"backend": "sim", "seed": 21}}
OUTSIDE = "http://203.0.113.7:8000"  # TEST-NET-3: never routed; the gateway must not even try


@pytest.fixture(scope="module")
def stack(tmp_path_factory, stacks):
    tmp = tmp_path_factory.mktemp("replica-hijack")
    users = {u: f"hijack-{u}-{os.getpid()}" for u in (*USERS, SET_USER)}
    conf = tmp / "auth.conf"
    defs = "".join(f'{u.upper().replace("-", "_")}_PASSWORD: "{users[u]}"\n' for u in USERS)
    conf.write_text(defs + with_sets(AUTH_CONF.read_text(), {SET: users[SET_USER]}))
    env = {"POPULACE_STORAGE": "memory", "POPULACE_INFER_DOWN_S": "30",
           "POPULACE_REPLICA_HOSTS": f"{SET_USER}@127.0.0.1"}
    # the extra process named like the set's user registers as that user (Stack)
    return stacks(hosts=2, db=str(tmp / "populace.duckdb"), users=users, nats_args=["-c", str(conf)], env=env,
                  extra={SET_USER: ["replicas", "sim", "--count", "1"]}, replicas=1, one_process=True, timeout=120)


def test_a_replicas_credential_can_neither_overwrite_nor_add_a_replica_the_gateway_calls(stack, monkeypatch):
    monkeypatch.setenv("POPULACE_REPLICA_HOSTS", stack.env["POPULACE_REPLICA_HOSTS"])  # the client's, as the fleet's
    prepared = prepare(RunConfig.model_validate(SCENARIO))
    rid = new_run_id()
    denied: list[str] = []
    connections: list[int] = []

    async def on_error(err: Exception) -> None:
        denied.append(str(err))

    async def go():
        async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(1)  # the attacker's server: anyone who connects is counted
            writer.close()

        server = await asyncio.start_server(count, "127.0.0.1", 0)
        own_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        cli = await nats.connect(stack.url, **stack.credentials("cli"))
        attacker = await nats.connect(stack.url, **stack.credentials("replicas"), error_cb=on_error)
        try:
            js = attacker.jetstream(timeout=1.0)
            kv = await js.key_value(subjects.REPLICAS_BUCKET)
            (legit,) = await bus.bucket_keys(js, subjects.REPLICAS_BUCKET)  # a key's subject is all it may list
            writer, replica_id = subjects.replica_key_parts(legit)
            assert writer == SET_USER

            def forged(rid_: str, url: str) -> bytes:
                return bus.encode(ReplicaInfo(replica_id=rid_, url=url, backend="sim", kind="sim", model="sim",
                                              max_concurrency=256, heartbeat_at=time.time()))

            for attack in (lambda: kv.put(legit, forged(replica_id, own_url)), lambda: kv.delete(legit)):
                with pytest.raises(nats.errors.TimeoutError):  # refused: nothing stored, no PubAck
                    await attack()
            shadows = {subjects.replica_key("replicas", replica_id): own_url,  # its own key, the real id
                       subjects.replica_key("replicas", "evil-0"): OUTSIDE}

            async def heartbeat() -> None:  # kept fresh all along, as a registrar would
                while True:
                    for key, url in shadows.items():
                        await kv.put(key, forged(subjects.replica_key_parts(key)[1], url))
                    await asyncio.sleep(1.0)

            beating = asyncio.create_task(heartbeat())
            await asyncio.sleep(3.0)  # the gateway polls every second: it has seen them before the run
            try:
                out = await play(cli, prepared.config, run_id=rid, manifest=prepared.manifest, stall_s=240)
            finally:
                beating.cancel()
            listed = sorted(await bus.bucket_keys(js, subjects.REPLICAS_BUCKET))
            return out, legit, listed
        finally:
            await attacker.close()
            await cli.close()
            server.close()

    out, legit, listed = asyncio.run(go())
    assert out.status == "completed", (out.status, out.reason)
    assert out.recorded is not None and out.recorded.outcomes == SCENARIO["agents"] * SCENARIO["rounds"]
    assert listed == sorted([legit, *(f"replicas.{k}" for k in (subjects.replica_key_parts(legit)[1], "evil-0"))])
    with duckdb.connect(stack.db, read_only=True) as con:
        answered = con.execute("SELECT replica, count(*), bool_and(valid) FROM llm_calls WHERE run_id = ? "
                               "GROUP BY replica", [rid]).fetchall()
        outcomes = con.execute("SELECT count(*), bool_and(valid) FROM guesses WHERE run_id = ?", [rid]).fetchone()
        manifest = json.loads(con.execute("SELECT manifest_json FROM runs WHERE run_id = ?", [rid]).fetchone()[0])
    assert answered == [(legit, SCENARIO["agents"] * SCENARIO["rounds"], True)]
    assert outcomes == (SCENARIO["agents"] * SCENARIO["rounds"], True)
    assert [r["replica_id"] for r in manifest["model"]["replicas"]] == [legit]  # what the gateway calls
    assert connections == []  # never probed, never called
    logs = "".join(p.read_text(errors="replace") for p in Path(stack.log_dir).glob("*.log"))
    refused = [json.loads(line) for line in logs.splitlines() if '"replica_refused"' in line]
    assert sorted(r["key"] for r in refused) == sorted(f"replicas.{k}" for k in (
        subjects.replica_key_parts(legit)[1], "evil-0")), refused  # once each, over ~40 polls
    assert all(f"registered by replicas is not in POPULACE_REPLICA_HOSTS ({SET_USER}@127.0.0.1)" in r["reason"]
               for r in refused), refused
    violations = [line for line in (Path(stack.log_dir) / "nats-server.log").read_text().splitlines()
                  if "Violation" in line]
    assert len(violations) == 2 and all(f'"$KV.replicas.{legit}"' in v for v in violations), violations
    assert len([e for e in denied if "permissions violation" in e.lower()]) == 2, denied
    stack.check_alive()
