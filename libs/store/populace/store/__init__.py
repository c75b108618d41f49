"""Populace's DuckDB store, owned by no service (docs/architecture.md): the schema of every
table (a run's outcome and summary tables from its `SimulationTables`, the interviews'), the
exactly-once ingest of wire events (`Store.ingest`), the checks a batch passes first
(`columns`, `expected`), and plain SQL reads (`snapshot`). The recorder is its consumer loop and
read server; `populace run --local` records through the same `Store` (`local_runs`); the analysis
library reads above it. It needs DuckDB, Arrow and the protocol, never scipy or plotly."""

from populace.store.store import SCHEMA, DiskFull, Event, IngestResult, Store, StoreError

__all__ = ["SCHEMA", "DiskFull", "Event", "IngestResult", "Store", "StoreError"]
