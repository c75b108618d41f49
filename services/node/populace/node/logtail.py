"""The end of a log file, bounded in lines and bytes (a child's log may be gigabytes)."""

from __future__ import annotations

import os
from pathlib import Path


def tail(path: str | Path, lines: int, max_bytes: int) -> tuple[str, bool]:
    """The last `lines` whole lines of the file, from at most its last `max_bytes` bytes, and
    whether older lines were left out. A missing file reads as empty."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            f.seek(start)
            data = f.read(size - start)
    except FileNotFoundError:
        return "", False
    cut = start > 0
    if cut:  # the first line read is probably a piece of one: drop it
        newline = data.find(b"\n")
        data = data[newline + 1:] if newline >= 0 else b""
    kept = data.decode("utf-8", errors="replace").splitlines()
    if len(kept) > lines:
        kept, cut = kept[-lines:], True
    return "\n".join(kept), cut
