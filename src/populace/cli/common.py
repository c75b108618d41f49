"""What every room of the CLI shares: how a command fails (exit codes), runs a coroutine, turns a
bad scenario into a field-naming message, reads `--set` and opens a DuckDB file; and the option
defaults and help texts several commands repeat. Imports point down: the rooms import this
module, never populace.cli.main."""

# No `from __future__ import annotations` (typer evaluates string ones at each start: populace.cli.main)
import contextlib
from pathlib import Path

import typer

from populace.cli import checks, display

NATS_DEFAULT = "nats://127.0.0.1:4222"
# read when the command runs (not when this module is imported), and shown in --help
NATS_ENV = "POPULACE_NATS_URL"
# results, report and export read a run a recorder is still writing through it
NATS_LIVE_HELP = "NATS URL of the recorder's stack, to read a run it is still writing"


def run_async(coro):
    """asyncio.run, asyncio imported by the commands that use it: not at every start (`populace --version`)."""
    import asyncio

    return asyncio.run(coro)


def fail(message: str, code: int = 2) -> None:
    # soft_wrap: an error keeps its lines as written (a pipe or CI log must not wrap it at 80)
    display.console.print(f"[red]error:[/red] {message}", soft_wrap=True)
    raise typer.Exit(code)


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


def scenario_overrides(pairs: list[str] | None) -> dict:
    """`--set game.ratio=1/2 --set rounds=5` → a nested mapping (values read as YAML scalars;
    populace.client.steer.overrides, which the manager's fork form uses too)."""
    from populace.client.steer import OverrideError, overrides

    try:
        return overrides(pairs)
    except OverrideError as err:
        fail(str(err))
    raise AssertionError  # unreachable


SET_HELP = "set a scenario key, e.g. --set game.ratio=1/2 (repeatable)"

NATS_HELP = "NATS URL of the stack the run lives on"


@contextlib.contextmanager
def read_db(db: str, runs: list[str] | None = None, nats: str = NATS_DEFAULT):
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
            ids = runs_named(con, named_runs(con, runs))
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


def named_runs(con, run_ids: list[str]) -> list[str]:
    from populace.analysis import known_runs

    known = known_runs(con)
    if "last" in run_ids and not known:
        fail("no runs recorded in this DuckDB file")
    return list(dict.fromkeys(known[0] if r == "last" else r for r in run_ids))  # a run named twice counts once
