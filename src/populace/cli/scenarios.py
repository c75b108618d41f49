"""What can be played and plans of runs: `populace simulations`, `validate` and `sweep`."""

# No `from __future__ import annotations` (typer evaluates string ones at each start: populace.cli.main)
from pathlib import Path
from typing import Annotated

import typer

from populace.cli import checks, display
from populace.cli.common import checked, fail
from populace.cli.playing import stack_url

app = typer.Typer(rich_markup_mode=None)  # its commands join the root's (populace.cli.main)


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
    with stack_url(nats, sp.backends, replicas, hosts, db) as url:
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
