"""`populace bench dummy`: the paper's dummy benchmark through every service, measured."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import duckdb
import httpx
from rich.table import Table

from populace.cli import display
from populace.client.prepare import checked
from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus
from populace.core.contracts import RunConfig
from populace.core.natsserver import free_port

FLOOR_SCRIPT = """
import asyncio, sys, time
n, latency = int(sys.argv[1]), float(sys.argv[2])
async def main():
    t = time.perf_counter()
    await asyncio.gather(*(asyncio.sleep(latency) for _ in range(n)))
    return time.perf_counter() - t
print(asyncio.run(main()))
"""


@dataclass
class DummyBenchResult:
    simulation: str
    agents: int
    rounds: int
    latency_s: float
    hosts: int
    storage: str  # JetStream storage of the run
    setup_s: float  # run start → every host has created its agents
    round_s: float  # round open → round result (mean over rounds)
    record_lag_s: float  # last result → every guess committed in DuckDB
    total_s: float  # run start → recorded
    recorded: int  # outcomes found in DuckDB (the simulation's outcome table)
    peak_rss_bytes: int  # all processes of the stack, sampled every 0.2 s
    baseline_rss_bytes: int  # the stack before the run
    bytes_per_agent: float  # (peak - baseline) / agents
    asyncio_floor_s: float | None  # plain asyncio: gather(N × sleep(latency)), one process
    messages_per_round: float  # messages nats-server received during the run, per round
    round_times_s: list[float] = field(default_factory=list)
    machine: dict = field(default_factory=dict)

    def to_json(self, **kw) -> str:
        return json.dumps(asdict(self), **kw)

    def table(self) -> Table:
        t = Table(title=f"dummy benchmark ({self.simulation}): {self.agents:,} agents × {self.rounds} round(s), "
                        f"latency {self.latency_s}s")
        t.add_column("measure")
        t.add_column("value", justify="right")
        gib = 1024**3
        for k, v in [
            ("setup (spawn agents)", f"{self.setup_s:.2f} s"),
            ("round (open → result)", f"{self.round_s:.2f} s"),
            ("record lag (result → in DuckDB)", f"{self.record_lag_s:.2f} s"),
            ("total (start → recorded)", f"{self.total_s:.2f} s"),
            ("outcomes recorded", f"{self.recorded:,}"),
            ("messages per round", f"{self.messages_per_round:,.0f}"),
            ("peak RSS, all processes", f"{self.peak_rss_bytes / gib:.2f} GiB"),
            ("bytes per agent", f"{self.bytes_per_agent:,.0f}"),
            ("plain asyncio floor", "—" if self.asyncio_floor_s is None else f"{self.asyncio_floor_s:.2f} s"),
        ]:
            t.add_row(k, v)
        return t


class RssSampler:
    def __init__(self, stack: Stack, every_s: float = 0.2) -> None:
        self.stack, self.every = stack, every_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.stack.rss_bytes())
            self._stop.wait(self.every)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.stack.rss_bytes())


def asyncio_floor(agents: int, latency: float) -> float:
    res = subprocess.run([sys.executable, "-c", FLOOR_SCRIPT, str(agents), str(latency)],
                         capture_output=True, text=True, check=True)
    return float(res.stdout.strip())


def received(monitor_port: int) -> int:
    """Messages nats-server has received from clients so far (its /varz `in_msgs`)."""
    return httpx.get(f"http://127.0.0.1:{monitor_port}/varz", timeout=5).json()["in_msgs"]


def run_dummy_bench(agents: int, latency: float, hosts: int, rounds: int = 1, floor: bool = True,
                    quiet: bool = False, storage: str = "memory", simulation: str = "ratio-game",
                    params: dict | None = None) -> DummyBenchResult:
    resolved = checked(RunConfig.model_validate({
        "name": f"bench-{simulation}", "simulation": simulation, "agents": agents, "rounds": rounds,
        "model": {"backend": "dummy", "latency_s": latency}, **(params or {})}))
    config, table = resolved.config, resolved.simulation.tables().outcomes
    workdir = tempfile.mkdtemp(prefix="populace-bench-")
    db = str(Path(workdir) / "bench.duckdb")
    monitor = free_port()
    # Memory storage (the default) keeps the benchmark about the pipeline, not this disk.
    stack = Stack(hosts=hosts, db=db, log_dir=str(Path(workdir) / "logs"), nats_args=["-m", str(monitor)],
                  env={"POPULACE_STORAGE": storage, "POPULACE_LOG_LEVEL": "INFO"})
    log = display.console.print if not quiet else (lambda *a, **k: None)
    try:
        stack.start()
        asyncio.run(stack.wait_ready(timeout=120))
        time.sleep(1.0)
        baseline = stack.rss_bytes()
        log(f"stack ready ({hosts} agent-hosts); running {agents:,} agents × {rounds} round(s)")

        async def go():
            nc = await bus.connect(stack.url, "populace-bench")
            try:
                with display.RunProgress(config, enabled=not quiet) as progress:
                    return await play(nc, config, on_event=progress.on_event, stall_s=600)
            finally:
                await nc.close()

        before = received(monitor)
        with RssSampler(stack) as sampler:
            outcome = asyncio.run(go())
        messages = received(monitor) - before
    finally:
        stack.stop()
    if outcome.status != "completed":
        raise RuntimeError(f"benchmark run {outcome.status}: {outcome.reason}")
    with duckdb.connect(db, read_only=True) as con:
        recorded = con.execute(f'SELECT count(*) FROM "{table}" WHERE run_id = ?', [outcome.run_id]).fetchone()[0]
    m = outcome.marks
    round_times = [m[f"result.{n}"] - m[f"open.{n}"] for n in range(1, rounds + 1)]
    floor_s = None
    if floor:
        log("measuring the plain-asyncio floor …")
        floor_s = asyncio_floor(agents, latency)
    return DummyBenchResult(
        simulation=simulation, agents=agents, rounds=rounds, latency_s=latency, hosts=hosts, storage=storage,
        setup_s=m["spawned"] - m["submitted"],
        round_s=sum(round_times) / len(round_times),
        record_lag_s=m["recorded"] - m[f"result.{rounds}"],
        total_s=m["recorded"] - m["submitted"],
        recorded=recorded, peak_rss_bytes=sampler.peak, baseline_rss_bytes=baseline,
        bytes_per_agent=max(0, sampler.peak - baseline) / agents,
        asyncio_floor_s=floor_s, messages_per_round=messages / rounds, round_times_s=round_times,
        machine={"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
    )
