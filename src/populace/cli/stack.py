"""`populace service`, `demo` and `up`: services and whole stacks in the foreground."""

# No `from __future__ import annotations` (typer evaluates string ones at each start: populace.cli.main)
import gc
import time
from pathlib import Path
from typing import Annotated

import typer

from populace.cli import checks, display
from populace.cli.choices import DemoModel
from populace.cli.common import SET_HELP, checked, fail, run_async, scenario_overrides
from populace.cli.playing import follow_prepared, print_metrics_ports, private_stack, report_run

app = typer.Typer(rich_markup_mode=None)  # its commands join the root's (populace.cli.main)


@app.command()
def service(
    name: Annotated[str, typer.Argument(help="orchestrator, agent-host, environment, gateway or recorder")],
) -> None:
    """Run one service in the foreground (POPULACE_* environment variables configure it)."""
    # a service process, as `python -m populace.core.serve` starts one: the collector stays off
    # while the service's modules load, and serve.run turns it back on with them frozen out of it
    gc.disable()
    from populace.core import serve

    if name not in serve.names():
        gc.enable()
        fail(f"unknown service {name!r}; choose one of: {', '.join(serve.names())}")
    serve.run(name)


# demo options that are scenario keys: given with --scenario, they apply to it (as --set would)
DEMO_SCENARIO_KEYS = {"agents": ("agents",), "rounds": ("rounds",), "seed": ("model", "seed"),
                      "latency": ("model", "latency_s"), "one_per_process": ("placement", "agents_per_process")}


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether option `name` was typed on the command line (not left at its default). By the
    source's name: typer vendors its own click, whose ParameterSource is another enum."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


@app.command()
def demo(
    ctx: typer.Context,
    agents: Annotated[int, typer.Option(help="number of agents")] = 1000,
    rounds: Annotated[int, typer.Option(help="rounds to play")] = 3,
    simulation: Annotated[str, typer.Option(help="simulation to play: ratio-game, public-goods, vote, opinion, or an "
                                                 "installed one (populace simulations)")] = "ratio-game",
    model: Annotated[DemoModel, typer.Option(
                                       help="model backend: dummy, local (SmolLM2 on llama.cpp), sim (simulated "
                                            "vLLM), vllm (SmolLM2 on vLLM's CPU build, prepared on first use; "
                                            "plays as backend openai) or openai (registered OpenAI-compatible "
                                            "replicas, e.g. `populace replicas vllm`)")] = "dummy",
    replicas: Annotated[int, typer.Option(min=1, help="LLM replicas to start for --model local/sim/vllm")] = 1,
    latency: Annotated[float, typer.Option(help="dummy backend: seconds per answer")] = 0.05,
    hosts: Annotated[int, typer.Option(min=1, help="agent-host processes")] = 2,
    one_per_process: Annotated[bool, typer.Option(help="one OS process per agent")] = False,
    seed: Annotated[int, typer.Option(help="model seed")] = 0,
    set_: Annotated[list[str] | None, typer.Option("--set", help=SET_HELP)] = None,
    db: Annotated[str, typer.Option(help="DuckDB file to write")] = "populace.duckdb",
    scenario: Annotated[Path | None, typer.Option(
        help="play this scenario file instead: its simulation, population, model and parameters replace the "
             "options above; --agents, --rounds, --seed, --latency and --one-per-process given with it apply "
             "to it, as --set does (--simulation and --model are refused with it)")] = None,
) -> None:
    """Start NATS and every service, play one run, print the rounds, leave the DuckDB file."""
    from populace.client.api import prepare_scenario
    from populace.client.prepare import parse_config, prepare
    from populace.core.scenario import merged

    if scenario is not None:
        for name, flag in (("simulation", "--simulation"), ("model", "--model")):
            if _given(ctx, name):
                fail(f"{flag}: --scenario names its own {name}; drop {flag}, or set it in the scenario "
                     f"(--set {'simulation=…' if name == 'simulation' else 'model.backend=…'})")
        values = {"agents": agents, "rounds": rounds, "seed": seed, "latency": latency,
                  "one_per_process": 1 if one_per_process else 0}
        extra: dict = {}
        for name, path in DEMO_SCENARIO_KEYS.items():
            if _given(ctx, name):
                value = values[name]
                for key in reversed(path):  # ("model", "seed") -> {"model": {"seed": value}}
                    value = {key: value}
                extra = merged(extra, value)
        extra = merged(extra, scenario_overrides(set_))  # --set has the last word
        prepared = checked(lambda: prepare_scenario(scenario, extra))
    else:
        prepared = checked(lambda: prepare(parse_config(merged({
            "simulation": simulation, "agents": agents, "rounds": rounds,
            "model": {"backend": "openai" if model == "vllm" else model, "latency_s": latency, "seed": seed},
            "placement": {"agents_per_process": 1 if one_per_process else 0},
        }, scenario_overrides(set_)))))
    config = prepared.config
    if config.models:  # a variable not set, a key file not readable, a URL that does not answer: before anything
        from populace.client.model_checks import check_local

        if why := check_local(list(config.models)):
            fail(why)
    starts = {"vllm"} if model == "vllm" and scenario is None else {config.model.backend}
    with private_stack(starts, replicas, hosts, db, tuple(config.models)) as url:
        outcome = run_async(follow_prepared(url, prepared, show_progress=True))
    report_run(outcome, prepared)


# `populace up`'s JetStream store: runs' state, checkpoints and events. Kept across restarts (the
# guide restarts `up` after a code change), so `populace resume` and `fork` still know its runs.
UP_STORE = "populace-nats"


@app.command()
def up(
    hosts: Annotated[int, typer.Option(min=1, help="agent-host processes")] = 2,
    port: Annotated[int, typer.Option(min=1, max=65535, help="NATS port")] = 4222,
    db: Annotated[str, typer.Option(help="DuckDB file the recorder writes")] = "populace.duckdb",
    store: Annotated[str, typer.Option(help="JetStream store dir: runs' state, checkpoints and events, kept "
                                            "across restarts so `populace resume` and `fork` still know them")
                     ] = UP_STORE,
    temporary_store: Annotated[bool, typer.Option(
        "--temporary-store", help="a temporary JetStream store, deleted at stop: its runs cannot be resumed or "
                                  "forked after a restart")] = False,
) -> None:
    """Run embedded NATS and every service in the foreground, for `populace run` to talk to."""
    from populace.client.live import StoreInUse, served_stack
    from populace.client.stack import StackError
    from populace.core.natsserver import NatsServerError

    checks.duckdb_file(db)
    checks.free_port(port)
    kept = ("temporary, deleted at stop" if temporary_store else
            "{}, kept at stop: `populace resume` works after a restart")
    try:
        with served_stack(hosts, port, db, None if temporary_store else Path(store)) as (stack, nats):
            run_async(stack.wait_ready())
            display.console.print(f"[green]ready[/green]: NATS at {nats.url}, {hosts} agent-hosts, "
                                  f"DuckDB {db}, JetStream store {kept.format(nats.store_dir)}, logs {stack.log_dir}. "
                                  "Ctrl-C stops.", soft_wrap=True)
            print_metrics_ports(stack.metrics_ports)
            while True:  # SIGTERM and Ctrl-C both end this loop with KeyboardInterrupt
                time.sleep(0.5)
                stack.check_alive()
    except KeyboardInterrupt:
        pass
    except StoreInUse as err:
        fail(str(err))
    except (StackError, NatsServerError) as err:
        fail(str(err), code=1)
