"""Playing a run from the CLI: a private stack (embedded NATS, every service, replicas for the
backends used) or the stack at --nats, following a prepared run on it, and printing its rounds
with the exit code of how it ended. `demo`, `up`, `run`, `rerun`, `sweep`, `manager` and
`populace replicas` use it."""

# No `from __future__ import annotations` (typer evaluates string ones at each start: populace.cli.main)
import contextlib
import time
from typing import TYPE_CHECKING

from populace.cli import checks, display
from populace.cli.common import fail, run_async

if TYPE_CHECKING:  # the client is imported where a command needs it: `populace --version` starts fast
    from populace.client.prepare import PreparedRun


async def follow_prepared(url: str, prepared: "PreparedRun", show_progress: bool, run_id: str | None = None):
    from populace.client.live import play_prepared

    c = prepared.config

    models = prepared.manifest.get("models") if prepared.manifest else None
    which = (f"models {', '.join(f'{name} ({n:,} agents)' for name, n in models.items())}" if models
             else f"model {c.model.backend}")

    def announce(rid: str) -> None:
        display.console.print(f"run {rid}: {c.simulation}, {c.agents:,} agents × {c.rounds} rounds ({which})",
                              soft_wrap=True, highlight=False)

    from populace.core.scenario import ScenarioError

    try:
        return await play_prepared(url, prepared, show_progress, run_id, on_start=announce)
    except ScenarioError as err:  # what the stack cannot serve, said before the run
        fail(str(err))


def report_run(outcome, prepared: "PreparedRun") -> None:
    report_outcome(outcome, prepared.resolved.simulation, prepared.config.agents)


def report_outcome(outcome, sim, agents: int | None = None) -> None:
    labels = display.summary_labels(sim.Summary)
    display.out.print(display.rounds_table(display.round_rows(outcome.results), labels,
                                           f"run {outcome.run_id} ({outcome.status})",
                                           agents=agents))
    if outcome.recorded:
        tables = sim.tables()
        display.out.print(f"recorded {outcome.recorded.outcomes} outcomes (table {tables.outcomes}) "
                          f"in {outcome.recorded.db_path}")
    elif outcome.unrecorded and outcome.status == "completed":
        fail(f"run {outcome.run_id} completed, but is not recorded yet: {outcome.unrecorded}", code=1)
    if outcome.status != "completed":
        fail(f"run {outcome.run_id} {outcome.status}: {outcome.reason}", code=1)


def print_metrics_ports(ports: dict[str, int]) -> None:
    """Which service exports its metrics on which port (POPULACE_METRICS_PORT on a local stack)."""
    if ports:
        where = ", ".join(f"{key} :{port}" for key, port in ports.items())
        display.console.print(f"metrics (http://127.0.0.1:PORT/metrics): {where}", soft_wrap=True)


def ensure_llama_cpp() -> None:
    """Install llama.cpp on first use of the local backend, saying so here (not in a log)."""
    from populace.replicas import llamacpp

    try:
        llamacpp.ensure(say=lambda line: display.console.print(line, markup=False, highlight=False, soft_wrap=True))
    except llamacpp.LlamaCppUnavailable as err:
        fail(str(err), code=1)


def ensure_vllm_cpu():
    """Prepare vLLM's CPU environment and model on first use, saying so here (not in a log)."""
    from populace.replicas import vllm_cpu

    try:
        return vllm_cpu.ensure(say=lambda line: display.console.print(line, markup=False, highlight=False,
                                                                      soft_wrap=True))
    except vllm_cpu.VllmUnavailable as err:
        fail(str(err), code=1)


@contextlib.contextmanager
def private_stack(backends: set[str], replicas: int, hosts: int, db: str, models: tuple = ()):
    """Embedded NATS, every service, and `replicas` LLM replicas per local/sim backend used (or, for
    a run with `models:`, per model that names no URL); yields the NATS URL and stops everything on
    the way out."""
    from populace.client import live
    from populace.client.stack import StackError

    checks.duckdb_file(db)  # refused now, not retried by the recorder for ever
    if models:
        backends = live.model_backends(models)
    if "local" in backends:
        ensure_llama_cpp()
    if "vllm" in backends:
        ensure_vllm_cpu()
    stack = live.private_stack(backends, replicas, hosts, db, models)
    display.console.print(f"starting nats-server and {4 + hosts + len(stack.extra)} services (logs: see below) …")
    t0 = time.monotonic()
    try:
        stack.start()
        display.console.print(f"logs: {stack.log_dir}")
        print_metrics_ports(stack.metrics_ports)
        if "vllm" in backends:
            display.console.print("starting vLLM (CPU build; about a minute) …")
        run_async(stack.wait_ready(timeout=live.ready_timeout(backends)))
        display.console.print(f"ready in {time.monotonic() - t0:.1f}s")
        yield stack.url
    except StackError as err:
        fail(str(err), code=1)
    finally:
        stack.stop()


@contextlib.contextmanager
def stack_url(nats: str | None, backends: set[str] = frozenset(), replicas: int = 1, hosts: int = 2,
               db: str = "populace.duckdb"):
    """The NATS URL to play on: the stack at `nats`, whose connection or stall errors exit 1,
    or (without `nats`) a private stack for the backends used."""
    if nats is None:
        with private_stack(backends, replicas, hosts, db) as url:
            yield url
        return
    try:
        yield nats
    except ConnectionError as err:
        fail(str(err), code=1)
    except (OSError, TimeoutError) as err:
        fail(refused() or f"cannot reach NATS at {nats} or the run stalled: {err}", code=1)


def refused() -> str | None:
    """A timeout that came with a permission NATS refused is that refusal, by name."""
    from populace.core.bus import refusal

    return refusal()
