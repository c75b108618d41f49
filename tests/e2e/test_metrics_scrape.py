"""Operator metrics of a running stack: every service process exports its own /metrics port
when POPULACE_METRICS_PORT is set (as `populace up` sets it: orchestrator on the first port,
then environment, gateway, recorder, agent-host-0 …). A small game on simulated vLLM replicas
moves the counters; `populace up` itself comes up with every service exporting and stops on
SIGTERM."""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from populace.client.run import play
from populace.client.stack import CORE_SERVICES, Stack, StackError, _port_taken, metrics_layout, service_keys
from populace.core import bus, metrics
from populace.core.contracts import RunConfig
from populace.core.natsserver import free_port

pytestmark = pytest.mark.e2e

AGENTS, ROUNDS = 40, 2


def free_ports_from(count: int) -> int:
    """A first port with `count` free ports from it on (nothing listens there now)."""
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(20_000, 60_000 - count)
        if not any(_port_taken(p) for p in range(first, first + count)):
            return first
    raise RuntimeError(f"no {count} consecutive free ports found")


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Series name -> (labels, value) of each sample on one /metrics port."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def total(series: dict, name: str, **labels: str) -> float:
    """The sum of a series' samples whose labels include `labels` (KeyError: not exported)."""
    return sum(v for have, v in series[name] if labels.items() <= have.items())


def expected_names(key: str) -> set[str]:
    """The series a service of the stack exports from its start (populace.core.metrics.BY_SERVICE)."""
    service = "agent-host" if key.startswith("agent-host") else key
    suffixes = {"counter": "_total", "histogram": "_count", "gauge": ""}
    names = {"populace_dead_letters_total"}
    for metric, _ in metrics.BY_SERVICE[service]:
        (family,) = metric.describe()
        names.add(family.name + suffixes[family.type])
    return names


def test_every_service_of_the_stack_exports_on_its_own_port_and_the_counters_move(tmp_path):
    first = free_ports_from(len(CORE_SERVICES) + 1)
    stack = Stack(hosts=1, db=str(tmp_path / "m.duckdb"),
                  env={"POPULACE_STORAGE": "memory", "POPULACE_METRICS_PORT": str(first)},
                  extra={"replicas-sim": ["replicas", "sim", "--count", "1"]}, replicas=1)
    with stack.up(timeout=120):
        assert stack.metrics_ports == metrics_layout(service_keys(1), first)
        before = {key: scrape(port) for key, port in stack.metrics_ports.items()}

        async def go():
            nc = await bus.connect(stack.url, "metrics-e2e")
            try:
                config = RunConfig.model_validate({"agents": AGENTS, "rounds": ROUNDS,
                                                   "model": {"backend": "sim", "seed": 3}})
                return await play(nc, config, stall_s=120)
            finally:
                await nc.close()

        out = asyncio.run(go())
        assert out.status == "completed", out.reason
        after = {key: scrape(port) for key, port in stack.metrics_ports.items()}

    for key, series in before.items():  # every name is there before the first run
        assert expected_names(key) <= set(series), (key, expected_names(key) - set(series))
    decisions = AGENTS * ROUNDS
    orch, host, gw, rec = after["orchestrator"], after["agent-host-0"], after["gateway"], after["recorder"]
    assert total(orch, "populace_round_seconds_count", service="orchestrator") == ROUNDS
    assert total(orch, "populace_round_seconds_sum", service="orchestrator") > 0
    assert total(orch, "populace_runs_total", status="started") == 1
    assert total(orch, "populace_runs_total", status="completed") == 1
    assert total(orch, "populace_runs_active") == 0
    assert total(after["environment"], "populace_rounds_total", service="environment") == ROUNDS
    assert total(host, "populace_round_seconds_count", service="agent-host") == ROUNDS
    assert total(host, "populace_batch_seconds_count", service="agent-host", kind="infer") >= ROUNDS
    assert total(host, "populace_items_total", service="agent-host", kind="infer") == decisions
    assert total(host, "populace_invalid_answers_total", service="agent-host") == 0
    assert total(host, "populace_retries_total", service="agent-host") == 0
    assert total(gw, "populace_batch_seconds_count", service="gateway", kind="infer") >= ROUNDS
    assert total(gw, "populace_llm_calls_total") == decisions
    assert total(gw, "populace_llm_seconds_count") == decisions
    assert total(gw, "populace_llm_tokens_total", kind="prompt") > 0
    assert total(gw, "populace_llm_tokens_total", kind="completion") > 0
    assert total(gw, "populace_reasks_total") >= 0  # the simulated replica answers to the schema
    assert total(gw, "populace_invalid_answers_total", service="gateway") == 0
    # one replica, named by its registry key: replicas.sim-0-<port>
    (replica,) = {labels["replica"] for labels, _ in gw["populace_llm_calls_total"]}
    assert replica.startswith("replicas.sim-0")
    assert total(gw, "populace_replica_up", replica=replica) == 1
    assert total(rec, "populace_batch_seconds_count", service="recorder", kind="messages") >= 1
    assert total(rec, "populace_items_total", service="recorder", kind="outcomes") == decisions
    for key, series in after.items():
        assert total(series, "populace_dead_letters_total") == 0, key


def test_a_taken_metrics_port_is_a_clear_error_before_anything_starts(tmp_path):
    first = free_ports_from(len(CORE_SERVICES) + 1)
    stack = Stack(hosts=1, db=str(tmp_path / "t.duckdb"), env={"POPULACE_METRICS_PORT": str(first)})
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", first + 2))  # the gateway's
        holder.listen()
        with pytest.raises(StackError, match=rf"POPULACE_METRICS_PORT={first}: port {first + 2} \(gateway\) "
                                             r"already in use"):
            stack.start()
    assert stack.procs == {} and stack.nats is None


def populace_up(tmp_path: Path, first: int, nats_port: int) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "up.out"
    with open(out, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "populace.cli", "up", "--hosts", "2", "--port", str(nats_port),
             "--db", str(tmp_path / "up.duckdb")],
            env={**os.environ, "POPULACE_METRICS_PORT": str(first), "POPULACE_STORAGE": "memory",
                 "COLUMNS": "250"},
            stdout=log, stderr=log, cwd=tmp_path)  # its JetStream store (./populace-nats) outside the tree
    return proc, out


def test_populace_up_runs_with_every_service_exporting(tmp_path):
    first = free_ports_from(len(CORE_SERVICES) + 2)
    proc, out = populace_up(tmp_path, first, free_port())
    try:
        deadline = time.monotonic() + 120
        while not (line := re.search(r"^metrics \(.*\n", out.read_text(), re.MULTILINE)):  # printed once ready
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        printed = dict(re.findall(r"([\w-]+) :(\d+)", line.group(0)))
        ports = metrics_layout(service_keys(2), first)
        assert {k: int(v) for k, v in printed.items()} == ports
        for key, port in ports.items():
            series = scrape(port)
            assert expected_names(key) <= set(series), (key, expected_names(key) - set(series))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # SIGINT too, but a background job may ignore it
        code = proc.wait(60)
    assert code == 0, out.read_text()
    assert not any(_port_taken(p) for p in ports.values())  # every service stopped with it


def test_populace_up_with_a_taken_metrics_port_exits_naming_the_variable(tmp_path, cli):
    """In process (the `cli` fixture): `up` refuses before it starts any service; the process
    boundary of `populace up` is the test above's."""
    first = free_ports_from(len(CORE_SERVICES) + 2)
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", first))
        holder.listen()
        done = cli("up", "--hosts", "2", "--port", str(free_port()), "--db", str(tmp_path / "up.duckdb"), cwd=tmp_path,
                   env={"POPULACE_METRICS_PORT": str(first), "POPULACE_STORAGE": "memory", "COLUMNS": "250"})
    code = done.returncode
    text = " ".join((done.stdout + done.stderr).split())
    assert code == 1, text
    assert f"POPULACE_METRICS_PORT={first}: port {first} (orchestrator) already in use" in text
    assert "Traceback" not in text
