"""A run's models that cannot work are refused before the run, one line naming the field: a key's
variable not set or its file unreadable, a URL nothing answers at, a model nobody serves."""

from __future__ import annotations

import socket
import time

import pytest

from populace.client.model_checks import check_local, fleet_refusal
from populace.core import bus, subjects
from populace.core.contracts import ModelEndpoint, ReplicaInfo


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def test_a_variable_not_set_or_a_file_unreadable_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.delenv("POPULACE_NO_SUCH_KEY", raising=False)
    env = ModelEndpoint(name="a", kind="openai", base_url="https://api.example.com/v1",
                        api_key_env="POPULACE_NO_SUCH_KEY")
    assert check_local([env]) == ("models.0.api_key_env: POPULACE_NO_SUCH_KEY is not set in this environment "
                                  "(the gateway reads the key from it)")
    missing = ModelEndpoint(name="b", kind="vllm", base_url="http://127.0.0.1:1", api_key_file=str(tmp_path / "k"))
    assert check_local([ModelEndpoint(name="c", kind="dummy"), missing]).startswith(
        f"models.1.api_key_file: {tmp_path / 'k'} cannot be read")


def test_a_url_nothing_answers_at_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv("POPULACE_TEST_KEY_SET", "sk-test-0000000000000000")
    url = f"http://127.0.0.1:{closed_port()}"
    why = check_local([ModelEndpoint(name="v", kind="vllm", base_url=url, api_key_env="POPULACE_TEST_KEY_SET")])
    assert why is not None and why.startswith(f"models.0.base_url: {url} does not answer")
    assert "sk-test" not in why


async def test_a_model_no_replica_serves_is_refused_on_a_fleet(nc, js):
    served = ModelEndpoint(name="smol", kind="llamacpp")
    nobody = ModelEndpoint(name="other", kind="vllm")
    kv = await js.key_value(subjects.REPLICAS_BUCKET)
    await kv.put("replicas.llama-0", bus.encode(ReplicaInfo(replica_id="llama-0", url="http://127.0.0.1:9", backend="local",
                                                   kind="llamacpp", model="SmolLM2", heartbeat_at=time.time(),
                                                   serves="smol")))
    assert await fleet_refusal(nc, [served]) is None
    assert await fleet_refusal(nc, [served, nobody]) == (
        "models.1.name: no replica serves 'other' (start one with `populace replicas vllm --serves other`, or give "
        "its base_url)")
    # a model at its URL, or one the gateway answers itself, needs no registered replica
    assert await fleet_refusal(nc, [ModelEndpoint(name="d", kind="dummy"),
                                    ModelEndpoint(name="h", kind="openai", base_url="https://x.example/v1")]) is None


@pytest.mark.parametrize("variable", ["POPULACE_NO_SUCH_KEY"])
def test_the_demo_refuses_such_a_scenario_in_one_line_before_starting_anything(cli, tmp_path, monkeypatch, variable):
    monkeypatch.delenv(variable, raising=False)
    scenario = tmp_path / "s.yaml"
    scenario.write_text("agents: 4\nrounds: 1\nmodels:\n  - {name: gpt, kind: openai, base_url: "
                        f"'https://api.example.com/v1', api_key_env: {variable}}}\n")
    res = cli("demo", "--scenario", str(scenario), "--db", str(tmp_path / "x.duckdb"))
    assert res.returncode == 2
    assert res.stdout.strip().splitlines() == [f"error: models.0.api_key_env: {variable} is not set in this "
                                               "environment (the gateway reads the key from it)"] or \
        res.stderr.strip().endswith("(the gateway reads the key from it)")
    assert not (tmp_path / "x.duckdb").exists()
