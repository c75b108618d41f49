"""Populace's DuckDB store, owned by no service (docs/architecture.md): the schema of every
table (a run's outcome and summary tables from its `SimulationTables`, the interviews'), the
exactly-once ingest of wire events (`Store.ingest`), the checks a batch passes first
(`columns`, `expected`), and plain SQL reads: a run's declared tables (`tables`, `lookup`), a
page of its agents and a round's distribution (`live`, with `measures` and `bins`), where its
rounds went (`profile`), a copy of some runs (`snapshot`). The recorder is its consumer loop and
read server; `populace run --local` records through the same `Store` (`local_runs`); the analysis
library (statistics, reports) reads above it. It needs DuckDB, Arrow and the protocol, never
scipy or plotly."""

from populace.store.store import SCHEMA, DiskFull, Event, IngestResult, Store, StoreError

__all__ = ["SCHEMA", "DiskFull", "Event", "IngestResult", "Store", "StoreError"]
