"""Streaming JSON Lines: one JSON object per line, UTF-8."""

from __future__ import annotations

import io
import itertools
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

_CHUNK = 2000


def write_jsonl(path: str | Path, records: Iterable[dict]) -> int:
    """Write ``records`` (any iterable, consumed lazily) to ``path``; return how many.

    The file is written next to its destination and renamed into place at the end, so a
    reader never sees half a file. Parent directories are created.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
    n = 0
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            buf: list[str] = []
            for rec in records:
                buf.append(dumps(rec))
                buf.append("\n")
                n += 1
                if len(buf) >= 2 * _CHUNK:
                    fh.write("".join(buf))
                    buf.clear()
            fh.write("".join(buf))
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n


def read_jsonl(path: str | Path) -> Iterator[dict]:
    """Yield the objects of a JSON Lines file (blank lines skipped)."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def parse_personas(data: bytes, source: str = "personas", max_bytes: int | None = None) -> list[dict]:
    """The records of a personas JSONL (as written by ``populace personas generate``), checked:
    each line is an object with a ``profile`` mapping, of at most ``max_bytes``. Errors name the line."""
    return list(iter_personas(data, source, max_bytes))


def iter_personas(data: bytes, source: str = "personas", max_bytes: int | None = None) -> Iterator[dict]:
    """`parse_personas` one record at a time: a reader that keeps only part of each record (a
    host's Cast) never holds a million whole records at once — with 1M agents they took
    gigabytes, and the freed memory stayed fragmented in the process."""
    for n, raw in enumerate(io.BytesIO(data), start=1):
        rec = _persona(raw, n, source, max_bytes)
        if rec is not None:
            yield rec


def read_personas(path: str | Path, max_bytes: int, source: str | None = None) -> tuple[list[dict], bytes]:
    """A personas file's records and bytes, checked line by line as it is read: a line longer
    than ``max_bytes`` is refused after reading ``max_bytes`` + 2 bytes of it, never whole (a
    1 GiB line took 4.3 GB to check when the file was read and parsed at once)."""
    source = source or str(path)
    records: list[dict] = []
    lines: list[bytes] = []
    with open(path, "rb") as fh:
        for n in itertools.count(1):
            raw = fh.readline(max_bytes + 2)  # the line and its CR LF; more is too long
            if not raw:
                break
            rec = _persona(raw, n, source, max_bytes)
            if rec is not None:
                records.append(rec)
            lines.append(raw)
    return records, b"".join(lines)


def _persona(raw: bytes, n: int, source: str, max_bytes: int | None) -> dict | None:
    """Line `n` as a persona record (None: a blank line)."""
    from populace.population.errors import PopulationError

    body = raw.rstrip(b"\r\n")
    if max_bytes is not None and len(body) > max_bytes:
        said = f"{len(body):,} bytes" if raw.endswith(b"\n") else f"more than {max_bytes:,} bytes"
        raise PopulationError(f"{source}:{n}: a persona of {said}, over the limit of {max_bytes:,} "
                              f"(POPULACE_PERSONA_MAX_BYTES)")
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise PopulationError(f"{source}:{n}: not UTF-8 ({err.reason} at byte {err.start})") from None
    if not line.strip():
        return None
    try:
        rec = json.loads(line)
    except ValueError as err:
        raise PopulationError(f"{source}:{n}: not valid JSON ({err})") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("profile"), dict):
        raise PopulationError(f"{source}:{n}: each line must be an object with a `profile` mapping")
    if not isinstance(rec.get("persona", {}), dict):
        raise PopulationError(f"{source}:{n}: `persona` must be a mapping")
    return rec
