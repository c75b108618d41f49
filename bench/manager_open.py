"""Round time of a large run with the manager's run page open in a browser, against without.

    uv run python bench/manager_open.py --agents 1000000 --rounds 3 --pairs 2 \
        --out bench/results/manager-open-1m.json

One stack for every run (embedded nats-server, every service its own process, 2 agent-hosts,
memory storage, the dummy model with `--latency` seconds per answer, as `populace bench dummy`).
Runs alternate, so the machine's drift falls on both sides: one with nothing watching, then
one with `populace manager` (its own process) serving headless Chromium on the run's page,
opened before the run is submitted so the page follows every round live (progress ticks,
round results, the chart). A round's time is the client's, as the benchmark measures it:
from its RoundOpen to its RoundResult. The manager is stopped between "with" runs, so a
"without" run has nothing of it running."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from populace.client.run import new_run_id, play
from populace.client.stack import Stack
from populace.core import bus
from populace.core.contracts import RunConfig
from populace.core.natsserver import free_port

CHROMIUM = "/usr/bin/chromium"


def play_once(url: str, config: RunConfig, rid: str) -> list[float]:
    async def go():
        nc = await bus.connect(url, "populace-bench")
        try:
            return await play(nc, config, run_id=rid, stall_s=900)
        finally:
            await nc.close()

    # Playwright's sync API runs an event loop in the main thread: play in another one
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        out = pool.submit(asyncio.run, go()).result()
    if out.status != "completed":
        raise RuntimeError(f"run {rid} {out.status}: {out.reason}")
    m = out.marks
    return [m[f"result.{n}"] - m[f"open.{n}"] for n in range(1, config.rounds + 1)]


@contextlib.contextmanager
def manager(url: str, log_dir: Path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "POPULACE_PARENT_PID"}
    with open(log_dir / "manager.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "populace.cli", "manager", "--nats", url, "--port", str(port)],
                                env=env, stdout=log, stderr=log, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the manager did not start") from None
                time.sleep(0.2)
        yield base
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency", type=float, default=1.0)
    ap.add_argument("--pairs", type=int, default=2, help="runs without, then with, this many times")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    config = RunConfig.model_validate({"name": "manager-open", "agents": args.agents, "rounds": args.rounds,
                                       "model": {"backend": "dummy", "latency_s": args.latency}})
    work = Path(tempfile.mkdtemp(prefix="populace-manager-open-"))
    stack = Stack(hosts=args.hosts, db=str(work / "bench.duckdb"), log_dir=str(work / "logs"),
                  env={"POPULACE_STORAGE": "memory"})
    rows: list[dict] = []
    with stack.up(timeout=120), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            for pair in range(args.pairs):
                for watched in (False, True):
                    rid = new_run_id()
                    if not watched:
                        times = play_once(stack.url, config, rid)
                        points = None
                    else:
                        with manager(stack.url, Path(stack.log_dir)) as base:
                            page = browser.new_page()
                            page.goto(f"{base}/runs/{rid}")
                            page.wait_for_function("() => document.getElementById('live').textContent === 'live'")
                            times = play_once(stack.url, config, rid)
                            page.wait_for_function(f"() => document.getElementById('chart').dataset.points === "
                                                   f"'{args.rounds}'", timeout=30_000)
                            points = int(page.evaluate("document.getElementById('chart').dataset.points"))
                            page.close()
                    row = {"pair": pair, "manager_open": watched, "run_id": rid, "round_s": times,
                           "mean_round_s": statistics.fmean(times), "chart_points": points}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            browser.close()
    without = [t for r in rows if not r["manager_open"] for t in r["round_s"]]
    with_ = [t for r in rows if r["manager_open"] for t in r["round_s"]]
    result = {"agents": args.agents, "rounds": args.rounds, "latency_s": args.latency, "hosts": args.hosts,
              "mean_round_s_without": statistics.fmean(without), "mean_round_s_with": statistics.fmean(with_),
              "change": statistics.fmean(with_) / statistics.fmean(without) - 1, "runs": rows,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}}
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
