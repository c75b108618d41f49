"""`populace validate` and `populace results --reference` on hostile files, as real processes: an
alias bomb, 100,000-deep nesting and a personas file whose first line is 1 GiB; reference files
with a 300 MB field, 6,000,000 rows (CSV and Parquet), counts of 1e19 and 1e300, and a sparse
1 TiB file. Each ends with exit 2 and one line naming the key or line and the limit — no
traceback — and the process never holds 600 MB (measured while it runs, and killed past it, so
a regression fails here instead of taking the machine's memory)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e

CAP = 600 * 1024 * 1024


def alias_bomb() -> str:
    """About 330 bytes: nine anchors, each a list of nine aliases to the one before (9**9 values)."""
    levels = ["&a [" + ",".join(['"lol"'] * 9) + "]"]
    for prev, name in zip("abcdefgh", "bcdefghi"):
        levels.append(f"&{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "[" + ", ".join(levels) + "]"


# The peak is the command's own: a fresh, small interpreter runs it and reports its child's
# RUSAGE_CHILDREN. The pytest worker's own child would not do: on Linux a child's ru_maxrss starts
# from its parent's resident size at the fork (the exec does not reset it), so a worker that had
# grown to 600 MB made every command "peak" at 604 MB whatever it did (a fresh clone's CI failed so).
MEASURE = """
import resource, subprocess, sys
code = subprocess.call(sys.argv[2:])
with open(sys.argv[1], "w") as out:
    out.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))
sys.exit(code)
"""


def validate(path: Path, tmp_path: Path) -> tuple[int, str, int]:
    """(exit code, output, peak resident bytes) of `populace validate PATH`."""
    return measured(tmp_path, "validate", str(path))


def measured(tmp_path: Path, *args: str) -> tuple[int, str, int]:
    """(exit code, output, peak resident bytes) of `populace ARGS`."""
    out, peak_file = tmp_path / "out.txt", tmp_path / "peak.txt"
    with out.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-c", MEASURE, str(peak_file), sys.executable, "-m", "populace.cli",
                                 *args], stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, "COLUMNS": "400"})
    measurer, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:  # also sampled while it runs: past the cap it is killed, not waited for
        try:
            rss = sum(child.memory_info().rss for child in measurer.children())
        except psutil.Error:
            rss = 0
        peak = max(peak, rss)
        if peak > CAP:
            for child in measurer.children():
                child.kill()
        time.sleep(0.05)
    if peak_file.exists() and peak_file.read_text():
        peak = max(peak, int(peak_file.read_text()))
    return proc.returncode, out.read_text(errors="replace"), peak


def check_one_line(code: int, output: str, peak: int, *needles: str) -> None:
    assert peak <= CAP, f"peak RSS {peak / 2**20:.0f} MB; output: {output[:300]}"
    assert code == 2, output[:2000]
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1, output[:2000]
    for needle in needles:
        assert needle in output, output


@pytest.mark.parametrize("name,text,needles", [
    ("bomb", "name: " + alias_bomb() + "\n", ("name.", "more than 100,000 values", "(the limit)")),
    ("deep", "name: " + "[" * 100_000 + "]" * 100_000 + "\n", ("name.0.0.0", "nested deeper than 64 levels")),
])
def test_validate_refuses_a_hostile_scenario_in_one_line_within_the_memory_cap(tmp_path, name, text, needles):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    check_one_line(*validate(path, tmp_path), *needles)


def test_validate_refuses_a_personas_file_with_a_1_gib_line_without_reading_it(tmp_path):
    personas = tmp_path / "p.jsonl"
    with personas.open("wb") as f:  # sparse: the line is 1 GiB long and takes no disk
        f.write(b'{"profile": {"education": "phd"}, "persona": {"description": "')
        f.truncate(1 << 30)
    scenario = tmp_path / "s.yaml"
    scenario.write_text("simulation: ratio-game\npopulation: {personas: p.jsonl}\n")
    check_one_line(*validate(scenario, tmp_path), "p.jsonl:1: a persona of more than 65,536 bytes",
                   "POPULACE_PERSONA_MAX_BYTES")


# --- reference files (`results/report --reference`): refused while streamed, never read whole ---

def field_of_300_mb(path: Path) -> None:
    with path.open("w") as f:
        f.write("# synthetic: a hostile file\nquestion,answer\nq,")
        block = "a" * (1 << 20)
        for _ in range(300):
            f.write(block)
        f.write("\n")


def rows_6m(path: Path) -> None:
    with path.open("w") as f:
        f.write("# synthetic: a hostile file\nquestion,answer\n")
        for _ in range(60):
            f.write("q,1\n" * 100_000)


def rows_6m_parquet(path: Path) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"question": pa.array(["q"] * 6).take(np.zeros(6_000_000, dtype=np.int32)),
                      "answer": pa.array(np.arange(6_000_000) % 7)})
    pq.write_table(table.replace_schema_metadata({"synthetic": "a hostile file"}), path)


def count_of(text: str):
    return lambda path: path.write_text(f"# synthetic: a hostile file\nquestion,answer,count\nq,1,{text}\n")


def sparse_1_tib(path: Path) -> None:
    with path.open("wb") as f:  # a header and a row, then 1 TiB of nothing (no disk)
        f.write(b"# synthetic: a hostile file\nquestion,answer\nq,1\n")
        f.truncate(1 << 40)


@pytest.mark.parametrize("name,make,needles", [
    ("field.csv", field_of_300_mb, ("field.csv, line 3: longer than 65,536 bytes (the limit)",)),
    ("rows.csv", rows_6m, ("rows.csv: more than 1,000,000 rows (the limit",)),
    ("rows.parquet", rows_6m_parquet, ("rows.parquet: 6,000,000 rows, over 1,000,000 (the limit",)),
    ("e19.csv", count_of("1e19"), ("e19.csv, line 3: count: '1e19' is over 1,000,000,000",)),
    ("e300.csv", count_of("1e300"), ("e300.csv, line 3: count: '1e300' is over 1,000,000,000",)),
    ("sparse.csv", sparse_1_tib, ("sparse.csv, line 4: longer than 65,536 bytes (the limit)",)),
])
def test_results_refuses_a_hostile_reference_file_in_one_line_within_the_memory_cap(tmp_path, name, make, needles):
    """Before, 1e19 and 1e300 raised OverflowError, the 300 MB field _csv.Error at 1.86 GB, and the
    6,000,000 rows were refused after 12.8 s and 1.9 GB. The reference is read before the database
    is opened, so none is needed."""
    path = tmp_path / name
    make(path)
    check_one_line(*measured(tmp_path, "results", "last", "--db", str(tmp_path / "none.duckdb"), "--reference",
                             str(path)), *needles)
