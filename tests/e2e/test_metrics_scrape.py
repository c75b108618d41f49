"""Operator metrics of a running stack: every service process exports its own /metrics port
when POPULACE_METRICS_PORT is set (as `populace up` sets it: orchestrator on the first port,
then environment, gateway, recorder, agent-host-0 …). `populace up` itself comes up with every
service exporting and stops on SIGTERM; a taken port is refused before anything starts. That a
stack's services export from their start and a small game on a simulated vLLM replica moves
their counters exactly is tests/e2e/test_game_e2e.py's process-per-service test (one stack for
that and its other checks; the helpers here are its own)."""

from __future__ import annotations

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

from populace.client.stack import CORE_SERVICES, Stack, StackError, _port_taken, metrics_layout, service_keys
from populace.core import metrics
from populace.core.natsserver import free_port

pytestmark = pytest.mark.e2e



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
