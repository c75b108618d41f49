"""Running a scenario from Python — a script or a notebook — with the same code as the CLI.

    from populace.client import simulate

    result = simulate("examples/public-goods.yaml")              # a private embedded stack
    result = simulate("scenario.yaml", nats="nats://host:4222")  # a running stack
    result = simulate({"simulation": "vote", "agents": 50}, local=True)  # this process, no NATS
    result.rounds.to_pandas()

In a notebook (an event loop is already running) use the awaitable form; the run id is
known as soon as the run is submitted:

    run = await start("examples/vote.yaml")
    run.run_id
    result = await run

Results are Arrow tables named like the DuckDB tables (`result.outcomes`, `result.rounds`;
`.to_pandas()` with pandas installed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from populace.client.prepare import PreparedRun, parse_config, prepare, prepare_file
from populace.client.run import RunOutcome, new_run_id
from populace.core.contracts import RoundResult, RunConfig, SimulationTables, Usage
from populace.core.scenario import ScenarioError, format_validation_error, merged

Scenario = str | Path | dict | RunConfig | PreparedRun


@dataclass
class SimulationResult:
    run_id: str
    status: str  # completed | failed
    reason: str | None
    config: RunConfig
    tables: SimulationTables
    rounds: pa.Table  # one row per round: n, n_valid, LLM work (Usage.RECORDED) and the summary columns
    outcomes: pa.Table | None  # one row per agent per round (None: the stack's DuckDB is not readable here)
    db_path: str | None = None
    manifest: dict = field(default_factory=dict)
    # the scenario's planned interviews: one row per agent, question and round (table `interviews`)
    interviews: pa.Table | None = None
    local: Any = field(default=None, repr=False)  # a local run's LocalResult: what post-hoc interviews ask

    def df(self, which: str = "rounds"):
        """A pandas DataFrame of `rounds` or `outcomes` (needs pandas)."""
        table = getattr(self, which)
        if table is None:
            raise ValueError(f"no {which} table in this result (the recorder's DuckDB is not readable here)")
        return table.to_pandas()


def prepare_scenario(scenario: Scenario, overrides: dict[str, Any]) -> PreparedRun:
    """A scenario (file, mapping, config or prepared run) with `overrides` merged in (deeply, as
    `--set` merges), validated and prepared once; ScenarioError names the field."""
    if isinstance(scenario, PreparedRun) and not overrides:
        return scenario
    if isinstance(scenario, PreparedRun):
        scenario = scenario.config
    try:
        if isinstance(scenario, (str, Path)) and not overrides:
            return prepare_file(scenario)
        if isinstance(scenario, (str, Path)):
            from populace.core.scenario import load_scenario_data

            data, text = load_scenario_data(scenario)
            data = merged(data, overrides)
            return prepare(parse_config(data), base=Path(scenario).parent,
                           agents_given="agents" in data, scenario_path=str(scenario), scenario_text=text)
        if isinstance(scenario, RunConfig):
            data = merged(scenario.model_dump(mode="json", exclude_unset=True), overrides)
        else:
            data = merged(scenario, overrides)
        return prepare(parse_config(data), agents_given="agents" in data)
    except ScenarioError:
        raise
    except ValueError as err:  # pydantic's ValidationError: name the fields
        from pydantic import ValidationError

        if isinstance(err, ValidationError):
            raise ScenarioError(format_validation_error(err)) from None
        raise


def _rounds_from_events(results: list[RoundResult]) -> pa.Table:
    rows = [{"run_id": r.run_id, "round": r.round, "n": r.n, "n_valid": r.n_valid,
             **r.usage.model_dump(include=set(Usage.RECORDED)), **r.summary}
            for r in sorted(results, key=lambda r: r.round)]
    return pa.Table.from_pylist(rows)


def _read_db(db_path: str, run_id: str, tables: SimulationTables) -> tuple[pa.Table, pa.Table, pa.Table] | None:
    import duckdb

    if not Path(db_path).exists():
        return None
    try:
        with duckdb.connect(db_path, read_only=True) as con:
            rounds = con.sql(f'SELECT * FROM "{tables.rounds}" WHERE run_id = $rid ORDER BY round',
                             params={"rid": run_id}).to_arrow_table()
            outcomes = con.sql(f'SELECT * FROM "{tables.outcomes}" WHERE run_id = $rid ORDER BY round, agent_id',
                               params={"rid": run_id}).to_arrow_table()
            try:
                interviews = con.sql("SELECT * FROM interviews WHERE run_id = $rid AND request IS NULL "
                                     "ORDER BY after_round, survey, agent_id, question",
                                     params={"rid": run_id}).to_arrow_table()
            except duckdb.CatalogException:  # a database from before interviews
                interviews = None
    except duckdb.Error:
        return None  # held by a recorder that is still writing other runs
    return rounds, outcomes, interviews


class Run:
    """A submitted run: `run_id` at once, `await run` for its result."""

    def __init__(self, prepared: PreparedRun, run_id: str, task: asyncio.Task) -> None:
        self.prepared = prepared
        self.run_id = run_id
        self._task = task

    def __await__(self):
        return self._task.__await__()

    def done(self) -> bool:
        return self._task.done()


# Agent-hosts a run is played on (or, locally, split over) unless told: `populace up`, `demo`,
# `run --local` and `simulate` alike.
DEFAULT_HOSTS = 2


async def start(scenario: Scenario, *, nats: str | None = None, local: bool = False, hosts: int = DEFAULT_HOSTS,
                db: str | None = None, progress: bool = True, **overrides: Any) -> Run:
    """Submit a run and return its handle at once (see the module docstring).

    `nats`: a running stack's URL (default: start a private one, stopped when the run ends).
    `local`: play in this process without NATS (dummy model); `hosts` then splits the agents
    as that many agent-hosts would hold them. `db`: the DuckDB file a private stack or a local
    run records to (default: a new temporary one; `result.db_path` says where).
    `overrides`: scenario keys to replace, e.g. `agents=100`; a mapping merges into the scenario's
    like `--set` (`game={"ratio": "1/2"}` keeps its other `game:` keys)."""
    prepared = prepare_scenario(scenario, overrides)
    run_id = new_run_id()
    if local:
        coro = _local(prepared, run_id, hosts, db)
    else:
        coro = _fleet(prepared, run_id, nats, hosts, db, progress)
    return Run(prepared, run_id, asyncio.get_running_loop().create_task(coro))


def simulate(scenario: Scenario, **kwargs: Any) -> SimulationResult:
    """`start` and wait for the result. Inside a running event loop (a notebook cell) the run
    goes on in a worker thread with its own loop; prefer `await start(...)` there."""

    async def go() -> SimulationResult:
        return await (await start(scenario, **kwargs))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(go())
    box: dict[str, Any] = {}

    def worker() -> None:
        try:
            box["result"] = asyncio.run(go())
        except BaseException as err:
            box["error"] = err

    thread = threading.Thread(target=worker, name="populace-simulate")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def local_failure(simulation: str, round_: int, err: BaseException) -> str:
    """A local run's reason to fail, as the fleet words it, with where the simulation's code
    raised (a local run prints no traceback)."""
    from populace.sdk.play import RoundPaused
    from populace.sdk.statecheck import UnsavedState

    if isinstance(err, UnsavedState):
        return str(err)
    if isinstance(err, RoundPaused):
        # bad input the platform refused (a world, a view, an edge edit, a scene): its message names
        # the simulation, the field and the round; where it raised is the simulation's own code, if anywhere
        import populace.sdk

        sdk = str(Path(populace.sdk.__file__).parent)
        cause = err.__cause__
        frames = traceback.extract_tb(cause.__traceback__) if cause is not None else []
        authors = [f for f in frames if not f.filename.startswith(sdk)]  # not the SDK's check that refused it
        where = authors[-1] if authors else None
        at = f" (at {Path(where.filename).name}:{where.lineno} in {where.name})" if where else ""
        return f"{err}{at}; fix the simulation, then run it again"
    where = traceback.extract_tb(err.__traceback__)[-1] if err.__traceback__ else None
    at = f" (at {Path(where.filename).name}:{where.lineno} in {where.name})" if where else ""
    return f"simulation {simulation!r}: round {round_} failed: {type(err).__name__}: {err}{at}"


def simulation_error(err: BaseException) -> BaseException:
    """What the simulation's code raised, for its reason: the round engine wraps what an
    environment raised in DecideFailed, whose own frame (engine.py) tells the author nothing.
    A DecideFailed with no cause (a rule of the round broken: a size, a World) is the reason."""
    from populace.sdk.engine import DecideFailed

    if isinstance(err, DecideFailed) and err.__cause__ is not None:
        return err.__cause__
    return err


async def _local(prepared: PreparedRun, run_id: str, hosts: int, db: str | None) -> SimulationResult:
    """Play in this process, checking between rounds that a checkpoint keeps every agent's
    state (populace.sdk.statecheck), and record the run to DuckDB like a fleet run. A failure
    of the simulation's code is the run's `failed` status with the reason, never a traceback."""
    from populace.graph.serial import loads
    from populace.population.cast import cast_from_jsonl
    from populace.sdk.llm import ModelUnavailable
    from populace.sdk.local import dummy_llm, run_local
    from populace.sdk.statecheck import StateCheck

    cast = prepared.cast  # parsed once, when the run was prepared
    if cast is None and prepared.personas is not None:
        cast = cast_from_jsonl(prepared.personas)
    graph = loads(prepared.graph) if prepared.graph is not None else None
    resolved = prepared.resolved
    tables = resolved.tables() if resolved else None
    started_at = time.time()
    closed: list[dict] = []
    check = StateCheck(dummy_llm)
    outcomes: dict[str, list] = {}
    posts: dict[str, list] = {}
    scenes: dict[str, dict[str, list]] = {}
    res = None
    status, reason = "completed", None
    try:
        res = await run_local(resolved or prepared.config, run_id=run_id, cast=cast, hosts=hosts, graph=graph,
                              llm=check, on_round=lambda n, row: closed.append(row))
        outcomes, posts = res.outcomes, res.posts
        scenes = {"acts": res.acts, "transcripts": res.transcripts, "edges": res.edges, "shown": res.shown}
        tables = res.tables
        check.finish()
    except ModelUnavailable:
        raise  # not the simulation's fault: the caller's model
    except Exception as err:
        status = "failed"
        reason = local_failure(resolved.simulation.name if resolved else prepared.config.simulation,
                               len(closed) + 1, simulation_error(err))
    rounds = {k: [row.get(k) for row in closed] for k in (closed[0] if closed else {})}
    db_path = db or str(Path(tempfile.mkdtemp(prefix="populace-")) / "populace.duckdb")
    if tables is not None:
        # lazy import: DuckDB and the store load when a local run is recorded, not with the client
        from populace.store.local_runs import record_local

        record_local(db_path, run_id=run_id, config=prepared.config, tables=tables, outcomes=outcomes,
                     rounds=rounds, posts=posts, **scenes, status=status, reason=reason, started_at=started_at,
                     manifest={**prepared.manifest, "run_id": run_id} if prepared.manifest else None,
                     personas=prepared.personas, interviews=res.interviews if res is not None else None,
                     interview_calls=res.interview_usage if res is not None else None,
                     profile=res.profile if res is not None else None,
                     audits=res.audits if res is not None else None,
                     prototypes=res.prototype_reports if res is not None else None,
                     population=res.population if res is not None else None)
        read = _read_db(db_path, run_id, tables)
    else:
        read = None
    if read is not None:
        table_rounds, table_outcomes, interviews = read
    else:
        table_rounds, table_outcomes = pa.Table.from_pylist(closed), pa.Table.from_pydict(outcomes)
        interviews = pa.Table.from_pydict(res.interviews) if res is not None and res.interviews else None
    return SimulationResult(run_id, status, reason, prepared.config, tables, table_rounds, table_outcomes,
                            db_path=db_path if read is not None else None, manifest=prepared.manifest,
                            interviews=interviews if interviews is not None and interviews.num_rows else None,
                            local=res)


def _arrow(columns: dict[str, list], declared: list) -> pa.Table:
    """A local run's rows as a table: JSON columns as JSON text, as the recorder stores them
    (a JSON column may hold values of different shapes, which Arrow cannot type as one)."""
    as_json = {c.name for c in declared if c.type == "JSON"}
    return pa.Table.from_pydict({k: [None if v is None else json.dumps(v) for v in values] if k in as_json else values
                                 for k, values in columns.items()})


@contextlib.asynccontextmanager
async def _stack(nats: str | None, backend: str, hosts: int, db: str | None):
    """(NATS URL, DuckDB path or None) of the stack to play on; a private one is stopped after."""
    if nats is not None:
        yield nats, db
        return
    from populace.client.live import private_stack, ready_timeout

    db = db or str(Path(tempfile.mkdtemp(prefix="populace-")) / "populace.duckdb")
    stack = private_stack({backend}, 1, hosts, db)
    await asyncio.to_thread(stack.start)
    try:
        await stack.wait_ready(timeout=ready_timeout({backend}))
        yield stack.url, db
    finally:
        await asyncio.to_thread(stack.stop)


async def _fleet(prepared: PreparedRun, run_id: str, nats: str | None, hosts: int, db: str | None,
                 progress: bool) -> SimulationResult:
    config = prepared.config
    from populace.client.live import play_prepared

    async with _stack(nats, config.model.backend, hosts, db) as (url, db_path):
        outcome: RunOutcome = await play_prepared(url, prepared, progress, run_id, client_name="populace-client")
    tables = prepared.resolved.tables() if prepared.resolved else None
    recorded_at = outcome.recorded.db_path if outcome.recorded else db_path
    read = _read_db(recorded_at, run_id, tables) if recorded_at and tables else None
    rounds, outcomes, interviews = read if read is not None else (_rounds_from_events(outcome.results), None, None)
    return SimulationResult(run_id, outcome.status, outcome.reason, config, tables, rounds, outcomes,
                            db_path=recorded_at if read is not None else None, manifest=prepared.manifest,
                            interviews=interviews if interviews is not None and interviews.num_rows else None)


__all__ = ["Run", "SimulationResult", "simulate", "start"]
