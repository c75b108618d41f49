"""A model behind a key, as a hosted provider is: SmolLM2 on a llama.cpp server that asks every
request for its key (Bearer, llama-cpp-python's --api_key), called through the fleet from a run
whose `models:` names only where the key comes from.

- The run completes, every decision recorded under the model's name.
- The key is found in no artefact: the DuckDB file, every service's log and every span it made
  (written to its log by OpenTelemetry's console exporter), the JetStream store's files (every
  message the run sent), the report, the manager's run page; and no process but the gateway (and
  the server) had it in its environment.
- A wrong key pauses the run at once, naming the model and that its key was refused, with no storm
  of retries; the run's hosts never held the key."""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

import duckdb
import psutil
import pytest
from starlette.testclient import TestClient

from populace.client.prepare import prepare
from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus
from populace.core.contracts import RunConfig, gateway_bindings
from populace.manager import ManagerSettings, create_app
from populace.replicas.launch import start_local, wait_healthy

pytestmark = pytest.mark.e2e

KEY_VARIABLE = "POPULACE_TEST_MODEL_KEY"
AGENTS = 8


def _files_holding(root: Path, needle: bytes) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            try:
                if needle in path.read_bytes():
                    found.append(str(path))
            except OSError:
                continue
    return found


async def _play(stack: Stack, config: RunConfig):
    manifest = prepare(config).manifest
    nc = await bus.connect(stack.url, "e2e-keyed")
    try:
        return await play(nc, config, stall_s=300, manifest=manifest)
    finally:
        await nc.close()


@pytest.fixture(scope="module")
def keyed_server():
    """One llama.cpp server asking for a key the test makes up (in this process's environment
    only while the module runs)."""
    key = "sk-test-" + secrets.token_hex(16)
    os.environ[KEY_VARIABLE] = key
    rs = start_local(1, threads=1, max_concurrency=2, api_key_env=KEY_VARIABLE)
    try:
        asyncio.run(wait_healthy(rs, timeout=180))
        yield rs.replicas[0].info.url, key
    finally:
        rs.stop()
        os.environ.pop(KEY_VARIABLE, None)


def _config(url: str) -> RunConfig:
    return RunConfig.model_validate({
        "agents": AGENTS, "rounds": 1, "model": {"seed": 1},
        "models": [{"name": "smol-keyed", "kind": "llamacpp", "base_url": url, "api_key_env": KEY_VARIABLE,
                    "prices": {"input": 0.5, "output": 2.0}}]})


def _stack(tmp: Path, config: RunConfig, gateway_key: str) -> Stack:
    keys, hosts = gateway_bindings(config.models)
    return Stack(hosts=1, db=str(tmp / "keyed.duckdb"), log_dir=str(tmp / "logs"),
                 env={"POPULACE_GATEWAY_KEYS": keys, "POPULACE_GATEWAY_MODEL_HOSTS": hosts,
                      KEY_VARIABLE: gateway_key,
                      # every span each service makes, written to its log: the traces are greped too
                      "OTEL_TRACES_EXPORTER": "console"},
                 secrets=(KEY_VARIABLE,))


def test_a_keyed_model_answers_and_its_key_is_in_no_artefact(keyed_server, tmp_path, cli):
    url, key = keyed_server
    config = _config(url)
    stack = _stack(tmp_path, config, key).start()
    try:
        asyncio.run(stack.wait_ready(timeout=90))
        # only the gateway holds the key: the hosts, the recorder and the others never had it
        for name, proc in stack.procs.items():
            environ = psutil.Process(proc.pid).environ()
            assert (KEY_VARIABLE in environ) == (name == "gateway"), name
        out = asyncio.run(_play(stack, config))
        assert out.status == "completed", out.reason
        page = ""
        with TestClient(create_app(ManagerSettings(nats_url=stack.url)), base_url="http://127.0.0.1") as c:
            page = c.get(f"/runs/{out.run_id}").text + c.get("/runs").text
        assert out.run_id in page
        store = Path(stack.nats.store_dir)
        assert _files_holding(store, key.encode()) == []  # every message of the run, as JetStream stored it
        assert any(store.rglob("*.blk"))  # (the store is where the messages are)
    finally:
        assert stack.stop() == []
    with duckdb.connect(stack.db, read_only=True) as con:
        n, models, answered = con.execute("SELECT count(*), count(DISTINCT model), count(*) FILTER (WHERE attempts > 0) "
                                          "FROM llm_calls WHERE run_id = ?", [out.run_id]).fetchone()
        assert (n, models, answered) == (AGENTS, 1, AGENTS)
        assert con.execute("SELECT DISTINCT model FROM llm_calls WHERE run_id = ?", [out.run_id]).fetchall() == \
            [("smol-keyed",)]
        dollars = con.execute("SELECT sum(dollars), sum(prompt_tokens), sum(completion_tokens) FROM llm_calls "
                              "WHERE run_id = ?", [out.run_id]).fetchone()
        assert dollars[0] == pytest.approx((dollars[1] * 0.5 + dollars[2] * 2.0) / 1e6)
        assert con.execute("SELECT count(*) FROM guesses WHERE run_id = ?", [out.run_id]).fetchone() == (AGENTS,)
    report = tmp_path / "report.html"
    res = cli("report", out.run_id, "--db", stack.db, "--out", str(report))
    assert res.returncode == 0, res.stdout + res.stderr
    assert key.encode() not in report.read_bytes()
    assert key not in page
    assert _files_holding(tmp_path, key.encode()) == []  # the database, every log and trace, the report
    assert '"name": "gateway.http"' in (tmp_path / "logs" / "gateway.log").read_text()  # (the calls' spans are there)


def test_a_refused_key_pauses_the_run_naming_the_model_without_a_storm(keyed_server, tmp_path):
    url, _ = keyed_server
    config = _config(url)
    stack = _stack(tmp_path, config, "sk-wrong-" + secrets.token_hex(8)).start()
    try:
        asyncio.run(stack.wait_ready(timeout=90))
        out = asyncio.run(_play(stack, config))
    finally:
        assert stack.stop() == []
    assert out.status == "paused", (out.status, out.reason)
    assert "smol-keyed" in out.reason and "key was refused" in out.reason, out.reason
    gateway = (Path(stack.log_dir) / "gateway.log").read_text()
    # the batch was refused once, not retried call by call for minutes
    assert gateway.count('"model_refused"') <= 2, gateway.count('"model_refused"')
