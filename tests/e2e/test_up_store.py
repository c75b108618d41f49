"""`populace up` keeps its JetStream store across restarts (issue 25, item 8): the guide says to
restart it after a code change, and a run that was cancelled, failed or paused before the
restart must still be known to `populace resume` and `fork` after it. The store it keeps is
printed at start; a second `up` on the same store is refused (nats-server takes no lock, and
two servers on one store directory corrupt it)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from populace.client.prepare import prepare
from populace.client.run import cancel, new_run_id, play, run_state
from populace.core import bus
from populace.core.contracts import RoundOpen, RunConfig
from populace.core.natsserver import free_port

pytestmark = pytest.mark.e2e


class Up:
    """`populace up` in the foreground of its own process group, as a terminal runs it."""

    def __init__(self, cwd: Path, port: int, *args: str) -> None:
        self.log = cwd / f"up-{time.monotonic_ns()}.log"
        self.killed = False
        self.out = open(self.log, "wb")
        # SIGINT back to its default in the child: a suite started in a background job (`cmd &`,
        # nohup, CI) ignores SIGINT, the child would inherit the ignore, and Ctrl-C in stop() would
        # only reach it as the SIGKILL a minute later (two minutes of this test, before)
        self.proc = subprocess.Popen([sys.executable, "-m", "populace.cli", "up", "--port", str(port), "--hosts", "1",
                                      *args], cwd=cwd, stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while "ready" not in self.text():
            assert self.proc.poll() is None, f"populace up exited ({self.proc.returncode}):\n{self.text()}"
            assert time.monotonic() < deadline, f"populace up not ready in {timeout}s:\n{self.text()}"
            time.sleep(0.2)
        return self.text()

    def stop(self) -> None:
        """Ctrl-C, then SIGKILL to its process group if it did not stop (`killed` says so)."""
        try:
            os.kill(self.proc.pid, signal.SIGINT)
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.killed = True
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        finally:
            self.out.close()


def cancelled_run(url: str) -> str:
    """A run cancelled in its second round: resumable, and known only to the stack's store."""
    prepared = prepare(RunConfig.model_validate({"agents": 50, "rounds": 3, "model": {"latency_s": 0.2}}))
    rid = new_run_id()

    async def go():
        nc = await bus.connect(url, "e2e-up-store")
        try:
            pending: list[asyncio.Task] = []

            def on_event(kind, model):
                if isinstance(model, RoundOpen) and model.round == 2:
                    pending.append(asyncio.ensure_future(cancel(nc, rid, "restarting up")))

            out = await play(nc, prepared.config, run_id=rid, manifest=prepared.manifest, stall_s=120,
                             on_event=on_event)
            await asyncio.gather(*pending)
            return out
        finally:
            await nc.close()

    out = asyncio.run(go())
    assert out.status == "cancelled", out.reason
    return rid


def known(url: str, rid: str):
    async def go():
        nc = await bus.connect(url, "e2e-up-store")
        try:
            return await run_state(nc, rid)
        finally:
            await nc.close()

    return asyncio.run(go())


def test_a_restarted_up_still_knows_the_runs_it_can_resume(tmp_path, cli):
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    first = Up(tmp_path, port)
    try:
        said = first.wait_ready()
        assert f"JetStream store {tmp_path / 'populace-nats'}, kept at stop" in said.replace("\n", "")
        rid = cancelled_run(url)
        # a second `up` on the same store is refused before it starts anything: in this process
        # (the `cli` fixture), which holds no lock of its own, so the lock it meets is the first's
        again = cli("up", "--port", str(free_port()), cwd=tmp_path)
        assert again.returncode == 2 and "--store: " in again.stderr and "is in use by another `populace up` (pid" \
            in again.stderr.replace("\n", "")
    finally:
        first.stop()
    second = Up(tmp_path, port)  # a code change, and `populace up` again
    try:
        second.wait_ready()
        state = known(url, rid)
        assert state is not None and state.status == "cancelled" and state.round == 1
    finally:
        second.stop()
    assert not first.killed and not second.killed, "Ctrl-C did not stop `populace up` within a minute"
