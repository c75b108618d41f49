"""Reading a stack's DuckDB file while its recorder may hold it for a moment.

After a run is recorded, a batch can still reach the recorder (a redelivery, a host's batch of
a round a pause cut short, a forged late batch): it opens the file to store or refuse it and
closes it after (Recorder.release_if_idle). A reader meeting that lock tries again, for up to
half a minute; any other error is raised at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import duckdb

T = TypeVar("T")


def read_recorded(db: str, read: Callable[[duckdb.DuckDBPyConnection], T], wait_s: float = 30.0) -> T:
    """`read(connection)` on a read-only connection to `db`, again while the recorder holds the file."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with duckdb.connect(db, read_only=True) as con:
                return read(con)
        except duckdb.IOException as err:
            if "lock" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
