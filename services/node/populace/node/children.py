"""A node's children: each one an OS process in its own session, its output appended to a log
file, signalled when the node dies (PR_SET_PDEATHSIG), restarted by its policy, and stopped
with SIGTERM, then SIGKILL of whatever of its process tree is left after the grace time."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

from populace.core import logs
from populace.core.contracts import ProcessInfo, ProcessState, RestartPolicy
from populace.core.processes import die_with_parent
from populace.node.commands import Launch, Spec
from populace.node.policy import after_exit

log = logs.get("populace.node")
POLL_S = 0.05  # how often a stop looks whether the process is gone


class Child:
    def __init__(self, proc_id: str, spec: Spec, restart: RestartPolicy, how: Launch, log_path: Path) -> None:
        self.proc_id, self.spec, self.restart, self.how, self.log_path = proc_id, spec, restart, how, log_path
        self.proc: subprocess.Popen | None = None
        self.state: ProcessState = "running"
        self.exit_code: int | None = None
        self.restarts = 0
        self.started_at = time.time()
        self.stop_requested = False
        self._restart_at: float | None = None
        self._sampled: dict[int, psutil.Process] = {}  # cpu_percent compares with the same object's last call

    def spawn(self) -> None:
        """Start (or start again) the process. Call it from the event loop's thread: the
        death signal is tied to the thread that forks (processes.die_with_parent)."""
        with open(self.log_path, "ab") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(self.how.argv, env=self.how.env, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=out, start_new_session=True, preexec_fn=die_with_parent())
        self.state, self.started_at, self._restart_at = "running", time.time(), None
        self._sampled.clear()
        log.info("child_started", proc=self.proc_id, pid=self.proc.pid, restarts=self.restarts)

    def supervise(self, now: float) -> None:
        """Notice an exit (and decide by the policy), or start again once the backoff is over."""
        if self.state == "running" and self.proc is not None and self.proc.poll() is not None:
            self.exit_code = self.proc.returncode
            decided = after_exit(self.restart, self.exit_code, self.restarts, now - self.started_at,
                                 self.stop_requested)
            self.state, self.restarts = decided.state, decided.restarts
            self._restart_at = now + decided.delay_s if decided.delay_s is not None else None
            log.warning("child_exited", proc=self.proc_id, exit_code=self.exit_code, next=self.state,
                        restart_in_s=decided.delay_s)
        elif self.state == "restarting" and self._restart_at is not None and now >= self._restart_at \
                and not self.stop_requested:
            self.spawn()

    async def stop(self, grace_s: float) -> None:
        """SIGTERM the process; SIGKILL its process group and every descendant still alive
        after `grace_s` (a replica's servers included). Never restarted afterwards."""
        self.stop_requested = True
        proc = self.proc
        if proc is None or proc.poll() is not None:  # exited already, or waiting out its backoff
            self.exit_code = proc.returncode if proc is not None else self.exit_code
            self.state = "stopped"
            return
        tree = self._descendants(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        # nothing signals another process's exit to an event loop: we poll it
        while time.monotonic() < deadline and (proc.poll() is None or any(_alive(p) for p in tree)):  # noqa: ASYNC110
            await asyncio.sleep(POLL_S)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            log.warning("child_killed", proc=self.proc_id, pid=proc.pid, grace_s=grace_s)
        for p in tree:  # descendants that left the group or outlived their parent's SIGTERM
            with contextlib.suppress(psutil.Error):
                if _alive(p):
                    p.kill()
        while proc.poll() is None:  # noqa: ASYNC110 — reaped: no zombie, and its exit code is known
            await asyncio.sleep(POLL_S)
        self.exit_code, self.state = proc.returncode, "stopped"
        log.info("child_stopped", proc=self.proc_id, exit_code=self.exit_code)

    @staticmethod
    def _descendants(pid: int) -> list[psutil.Process]:
        try:
            return psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            return []

    def pids(self) -> list[int]:
        """The child's live process tree (its own pid first)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        return [self.proc.pid, *(p.pid for p in self._descendants(self.proc.pid))]

    def _usage(self) -> tuple[float, int]:
        """CPU % (100 = one core) and resident memory of the child's process tree."""
        cpu, rss, seen = 0.0, 0, {}
        for pid in self.pids():
            p = self._sampled.get(pid)
            try:
                if p is None:
                    p = psutil.Process(pid)
                cpu += p.cpu_percent(None)  # since the last call on this object (0.0 the first time)
                rss += p.memory_info().rss
            except psutil.Error:
                continue
            seen[pid] = p
        self._sampled = seen
        return cpu, rss

    def info(self) -> ProcessInfo:
        cpu, rss = self._usage() if self.state == "running" else (0.0, 0)
        running = self.state == "running" and self.proc is not None
        return ProcessInfo(proc_id=self.proc_id, spec=self.spec, restart=self.restart, state=self.state,
                           pid=self.proc.pid if running else None, exit_code=self.exit_code,
                           restarts=self.restarts, started_at=self.started_at, cpu_percent=round(cpu, 1),
                           rss_bytes=rss, log_path=str(self.log_path))


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
