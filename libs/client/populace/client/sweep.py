"""Sweeps (`populace sweep EXPERIMENTS.yaml`): every cell of a grid × every seed, as separate
runs on one stack (a private one, or a running one), collected into one results table.

Every scenario is validated and its population resolved before anything starts, so a typo in
the last cell fails in a second, not after an hour of runs."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from populace.client.prepare import PreparedRun, prepare
from populace.client.t_interval import mean_ci
from populace.core import bus
from populace.core.scenario import ScenarioError
from populace.core.sweep import Cell, SweepSpec, cell_label, expand, load_sweep

# The platform's columns of the results table (one row per run and round); each simulation's
# round summary columns follow.
COLUMNS = ("sweep", "cell", "run_id", "status", "seed", "round", "n", "n_valid")


@dataclass
class SweepPlan:
    spec: SweepSpec
    cells: list[Cell]
    prepared: list[PreparedRun]
    sweep_id: str  # also in every run's manifest

    @property
    def backends(self) -> set[str]:
        return {p.config.model.backend for p in self.prepared}


def plan(path: str | Path) -> SweepPlan:
    """Load, expand and prepare every run (raises ScenarioError naming the field)."""
    p = Path(path)
    spec, base = load_sweep(p)
    cells = expand(spec, base)
    sweep_id = time.strftime("sweep-%Y%m%d-%H%M%S")
    prepared = []
    for cell in cells:
        extra = {"sweep": {"id": sweep_id, "name": spec.name, "cell": cell.index, "values": cell.values,
                           "seed": cell.seed, "file": str(p)}}
        try:
            prepared.append(prepare(cell.config, base=p.parent, agents_given="agents" in cell.data,
                                    scenario_path=str(p), extra=extra))
        except ScenarioError as err:
            raise ScenarioError(f"{cell_label(cell.values)}:\n{err}") from None
    return SweepPlan(spec, cells, prepared, sweep_id)


async def run_all(url: str, sp: SweepPlan, show_progress: bool = True) -> list[dict]:
    """Play every run in order; one row per run and round (a failed run gets one row)."""
    from populace.client.run import RunStalled, new_run_id, play

    rows: list[dict] = []
    nc = await bus.connect_or_fail(url, "populace-sweep")
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(stderr=True), disable=not show_progress)
    try:
        with progress:
            task = progress.add_task("runs", total=len(sp.cells))
            for cell, prep in zip(sp.cells, sp.prepared):
                progress.update(task, description=f"run {cell.index + 1}/{len(sp.cells)}: {cell.label}, "
                                                  f"seed {cell.seed}")
                base = {"sweep": sp.sweep_id, "cell": cell.label, "seed": cell.seed}
                rid = new_run_id() + f"-c{cell.index}"
                try:
                    outcome = await play(nc, prep.config, run_id=rid, personas=prep.personas,
                                         graph=prep.graph_blobs, manifest=prep.manifest)
                except RunStalled as err:
                    rows.append({**base, "run_id": rid, "status": f"stalled: {err}"})
                    progress.advance(task)
                    continue
                for r in sorted(outcome.results, key=lambda r: r.round):
                    rows.append({**base, "run_id": outcome.run_id, "status": outcome.status, "round": r.round,
                                 "n": r.n, "n_valid": r.n_valid, **r.summary})
                if not outcome.results:
                    rows.append({**base, "run_id": outcome.run_id, "status": f"{outcome.status}: {outcome.reason}"})
                progress.advance(task)
    finally:
        await nc.close()
    columns = [*COLUMNS, *dict.fromkeys(k for row in rows for k in row if k not in COLUMNS)]
    return [{c: row.get(c) for c in columns} for row in rows]


def key_column(rows: list[dict]) -> str | None:
    """The column a sweep summarises: the first numeric column of the round summaries (the
    ratio game's mean, the public-goods game's mean contribution …)."""
    for row in rows:
        for k, v in row.items():
            if k not in COLUMNS and isinstance(v, (int, float)) and not isinstance(v, bool):
                return k
    return None


def summary(rows: list[dict]) -> list[dict]:
    """Per cell: the key column (`key_column`) of each run's last round, its mean across the
    cell's seeds and a 95% Student-t CI across them (None for one seed); `valid` is the share of
    valid answers in those rounds. Rows without a round (a run that stalled or failed) are left out."""
    key = key_column(rows)
    last: dict[tuple[str, str, int], dict] = {}
    for r in rows:
        if r.get("round") is None:
            continue
        run = (r["cell"], r["run_id"], r["seed"])
        if run not in last or r["round"] > last[run]["round"]:
            last[run] = r
    by_cell: dict[str, list[dict]] = {}
    for (cell, _, _), r in last.items():
        by_cell.setdefault(cell, []).append(r)
    out = []
    for cell, runs in by_cell.items():
        ci = mean_ci([r.get(key) for r in runs] if key else [])  # None values are dropped
        out.append({"cell": cell, "runs": len(runs), "last_round": max(r["round"] for r in runs), "key": key,
                    "mean": ci["mean"], "ci_low": ci["low"], "ci_high": ci["high"],
                    "valid": sum(r["n_valid"] for r in runs) / max(1, sum(r["n"] for r in runs))})
    return out


def write_rows(rows: list[dict], out: Path) -> None:
    """CSV or Parquet, by the file's extension."""
    import pyarrow as pa

    fixed = [("sweep", pa.string()), ("cell", pa.string()), ("run_id", pa.string()), ("status", pa.string()),
             ("seed", pa.int64()), ("round", pa.int32()), ("n", pa.int64()), ("n_valid", pa.int64())]
    # The simulation's summary columns: numbers as float64, anything else as its JSON text.
    extra = [k for k in (rows[0] if rows else {}) if k not in COLUMNS]
    numeric = {k for k in extra if all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
                                       for v in (r.get(k) for r in rows))}
    rows = [{**r, **{k: (r.get(k) if k in numeric or r.get(k) is None else json.dumps(r.get(k)))
                     for k in extra}} for r in rows]
    table = pa.Table.from_pylist(rows, schema=pa.schema(
        [*fixed, *((k, pa.float64() if k in numeric else pa.string()) for k in extra)]))
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, out)
    else:
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, out)


def failed(rows: list[dict]) -> list[str]:
    return sorted({r["run_id"] for r in rows if r["status"] != "completed"})


def run_sweep(url: str, sp: SweepPlan, show_progress: bool = True) -> list[dict]:
    return asyncio.run(run_all(url, sp, show_progress))
