"""A run's life on a stack: `populace run` (or --local, or --estimate), `cancel`, `resume`,
`follow`, `fork` and `rerun`."""

# No `from __future__ import annotations` (typer evaluates string ones at each start: populace.cli.main)
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from populace.cli import checks, display
from populace.cli.common import (
    NATS_DEFAULT,
    NATS_ENV,
    NATS_HELP,
    SET_HELP,
    checked,
    fail,
    named_runs,
    read_db,
    run_async,
    scenario_overrides,
)
from populace.cli.playing import follow_prepared, refused, report_outcome, report_run, stack_url

if TYPE_CHECKING:  # the client is imported where a command needs it: `populace --version` starts fast
    from populace.client.prepare import PreparedRun

app = typer.Typer(rich_markup_mode=None)  # its commands join the root's (populace.cli.main)


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

    extra = scenario_overrides(set_)
    prepared = checked(lambda: prepare_scenario(scenario, extra))
    if estimate:
        return _estimate(scenario, extra, prepared, nats, pilot, progress)
    if local:
        return _run_local(prepared, hosts, db)
    from populace.client.run import new_run_id

    rid = new_run_id()
    with stack_url(nats) as url:
        try:
            outcome = run_async(follow_prepared(url, prepared, show_progress=progress, run_id=rid))
        except KeyboardInterrupt:
            _detached(url, rid, cancel_on_exit)
            raise typer.Exit(130) from None
    report_run(outcome, prepared)


def _run_local(prepared: "PreparedRun", hosts: int, db: str) -> None:
    """`run --local`: play in this process, print the rounds, record the run to `db` as the
    recorder records a fleet run; a simulation that fails (its code raised, or its agents keep
    state a checkpoint would lose) exits 1 with the reason, never a traceback."""
    from populace.client import simulate
    from populace.store.local_runs import LocalRecordError

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
    with stack_url(nats) as url:
        outcome = run_async(follow_prepared(url, pilot, show_progress=progress))
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
        fail(refused() or f"cannot reach NATS or the run stalled: {err}", code=1)
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
    report_outcome(outcome, resolve(state.config).simulation, state.config.agents)


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
    report_outcome(outcome, resolve(state.config).simulation, state.config.agents)


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

    changes = scenario_overrides(set_)
    rid = new_run_id()
    try:
        forked = _steer(lambda: steer.fork_run(nats, run_id, from_round, changes, progress, rid))
    except KeyboardInterrupt:
        _detached(nats, rid, False)
        raise typer.Exit(130) from None
    display.console.print(f"fork {rid} of {run_id} after round {from_round}"
                          + (f", changed: {json.dumps(changes)}" if changes else ""), soft_wrap=True)
    report_run(forked.outcome, forked.prepared)


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

    with read_db(db, [run_id], nats or NATS_DEFAULT) as con:
        rid = named_runs(con, [run_id])[0]
        row = con.execute("SELECT manifest_json FROM runs WHERE run_id = ?", [rid]).fetchone()
        if row is None:
            fail(f"run {rid!r} is not in {db}")
        if row[0] is None:
            fail(f"run {rid!r} has no manifest (recorded before manifests existed)")
        prepared = checked(lambda: prepare_rerun(json.loads(row[0])))
        table = prepared.resolved.simulation.tables().rounds
        cur = con.execute(f'SELECT * FROM "{table}" WHERE run_id = ? ORDER BY round', [rid])
        before = [dict(zip([d[0] for d in cur.description], r)) for r in cur.fetchall()]
    with stack_url(nats, {prepared.config.model.backend}, replicas, hosts, db) as url:
        outcome = run_async(follow_prepared(url, prepared, show_progress=True))
    after = {r.round: r for r in outcome.results}
    labels = display.summary_labels(prepared.resolved.simulation.Summary)
    display.out.print(display.rerun_table(before, after, labels, rid, outcome.run_id))
    if outcome.status != "completed":
        fail(f"run {outcome.run_id} {outcome.status}: {outcome.reason}", code=1)
