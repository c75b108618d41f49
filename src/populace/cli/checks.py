"""Refusals of bad input before a command starts its work, each one line naming the flag and
exit 2: a file the command will write (a report, an export, a results table, a DuckDB file a
private stack's recorder will write), a port to serve on, and an attribute a `--by` names.

A path is checked by creating (and deleting) a file where the writer will write, so the answer is
right for root and for read-only mounts alike, where permission bits are not."""

# No `from __future__ import annotations` (typer evaluates string ones at each start: populace.cli.main)
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import typer

from populace.cli import display

DUCKDB_MAGIC = b"DUCK"  # bytes 8..12 of every DuckDB database file (after the header's checksum)


def refuse(message: str) -> NoReturn:
    display.console.print(f"[red]error:[/red] {message}", soft_wrap=True, markup=True, highlight=False)
    raise typer.Exit(2)


def _reason(err: OSError) -> str:
    return err.strerror or type(err).__name__


def _folder(folder: Path, flag: str) -> None:
    """`folder` can be made and written in: its nearest existing ancestor is a folder where a file
    can be created (and deleted again). Nothing is left behind: the writer makes the folder."""
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path.cwd())
    if not existing.is_dir():
        refuse(f"{flag}: {existing} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        where = folder if existing == folder else f"{existing} (to make {folder})"
        refuse(f"{flag}: cannot write in {where} ({_reason(err)})")


def output_file(path: str | Path, flag: str, suffixes: Sequence[str] = ()) -> Path:
    """A file the command will write, or refused: a folder, a suffix not in `suffixes` (e.g.
    (".csv", ".parquet")), a folder that cannot be created, or a file that cannot be written."""
    p = Path(path)
    if suffixes and p.suffix.lower() not in suffixes:
        refuse(f"{flag}: {p} must end in {' or '.join(suffixes)}")
    if p.is_dir():
        refuse(f"{flag}: {p} is a folder; give a file name")
    _folder(p.parent, flag)
    if p.exists() and not os.access(p, os.W_OK):
        refuse(f"{flag}: {p} is not writable")
    return p


def output_folder(path: str | Path, flag: str) -> Path:
    """A folder the command will write files into, or refused: an existing file, or a folder
    that cannot be created or written in."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        refuse(f"{flag}: {p} is a file; give a folder")
    _folder(p, flag)
    return p


def is_duckdb(path: Path) -> bool:
    """Whether `path` (an existing file) is a DuckDB database, by its header; an empty file is
    not (DuckDB refuses it too)."""
    with path.open("rb") as f:
        return f.read(12)[8:12] == DUCKDB_MAGIC


def duckdb_file(path: str | Path, flag: str = "--db") -> Path:
    """A DuckDB file a recorder will write (created if missing), or refused: see output_file,
    and an existing file that is not a DuckDB database."""
    p = output_file(path, flag)
    if p.exists() and not is_duckdb(p):
        refuse(f"{flag}: {p} is not a DuckDB database file")
    return p


@contextmanager
def writing(path: str | Path, flag: str) -> Iterator[None]:
    """A write that fails after the checks above (the disk filled, the folder went away) is
    refused by its flag, not shown as a traceback."""
    try:
        yield
    except OSError as err:
        refuse(f"{flag}: cannot write {path} ({_reason(err)})")


def write_text(path: Path, text: str, flag: str = "--out") -> None:
    """`text` into `path` (its folder made), or refused by `flag` (a bench's JSON result)."""
    with writing(path, flag):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def attribute(con, run_ids: list[str], by: str | None, flag: str = "--by") -> None:
    """`by` is a profile or persona attribute of the runs (what `--by` groups by), or refused
    with the ones there are."""
    if by is None:
        return
    from populace.analysis import group_attributes

    available = group_attributes(con, run_ids)
    if by not in available:
        there = ", ".join(available) if available else "none: these runs have no population"
        refuse(f"{flag}: {by!r} is not an attribute of the agents of run(s) {', '.join(run_ids)} ({there})")


def free_port(port: int, flag: str = "--port", host: str = "127.0.0.1") -> None:
    """`port` of `host` can be served on: nothing listens there yet, and the address is this
    machine's. (A nats-server started on a taken port exits, but `populace up`'s readiness check
    connects there, meets the other server and would carry on with it.)"""
    from populace.core.natsserver import bound_socket

    try:
        bound_socket(host, port).close()
    except OSError as err:
        refuse(f"{flag}: cannot listen on {host}:{port} ({_reason(err)}); stop what holds it or choose another port")
