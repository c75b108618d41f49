"""`populace validate` and `populace results --reference` on hostile files, as real processes: an
alias bomb, 100,000-deep nesting and a personas file whose first line is 1 GiB; reference files
with a 300 MB field, 6,000,000 rows (CSV and Parquet), counts of 1e19 and 1e300, and a sparse
1 TiB file. Each ends with exit 2 and one line naming the key or line and the limit — no
traceback — and the process never holds 600 MB (measured while it runs, and killed past it, so
a regression fails here instead of taking the machine's memory)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
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


# Each command is a process of its own, forked by one small interpreter that imported the CLI once
# (`python -m populace.cli` imports the same and calls the same app): its exit code, its output and
# its peak resident size (wait4's, the child's own) are a real process's, without an interpreter
# importing the world per case. The peak is measured on a child of that interpreter, never of the
# pytest worker: on Linux a child's ru_maxrss starts from its parent's resident size at the fork, so
# a worker that had grown to 600 MB made every command "peak" at 604 MB whatever it did (a fresh
# clone's CI failed so); the forker's own size is what `python -m populace.cli` imports anyway.
FORKER = r"""
import json, os, sys, traceback
from populace.cli.main import app

print("ready", flush=True)
for line in sys.stdin:
    args, out = json.loads(line)
    pid = os.fork()
    if pid == 0:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.argv = ["populace", *args]
        code = 1
        try:
            app()
            code = 0
        except SystemExit as stop:  # as the interpreter ends on it
            code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
            if not isinstance(stop.code, (int, type(None))):
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status, usage = os.wait4(pid, 0)
    print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024]), flush=True)
"""


@pytest.fixture(scope="module")
def forker():
    proc = subprocess.Popen([sys.executable, "-c", FORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "COLUMNS": "400"})
    assert proc.stdout.readline() == "ready\n", "the forker did not import the CLI"
    yield proc
    proc.stdin.close()
    proc.wait(30)


def validate(forker, path: Path, tmp_path: Path) -> tuple[int, str, int]:
    """(exit code, output, peak resident bytes) of `populace validate PATH`."""
    return measured(forker, tmp_path, "validate", str(path))


def measured(forker, tmp_path: Path, *args: str) -> tuple[int, str, int]:
    """(exit code, output, peak resident bytes) of `populace ARGS`, in a process forked for it."""
    out = tmp_path / "out.txt"
    forker.stdin.write(json.dumps([list(args), str(out)]) + "\n")
    forker.stdin.flush()
    measurer, peak = psutil.Process(forker.pid), 0
    while not select.select([forker.stdout], [], [], 0.05)[0]:  # sampled while it runs: past the cap it
        assert forker.poll() is None, "the forker died"        # is killed, not waited for
        try:
            rss = sum(child.memory_info().rss for child in measurer.children())
        except psutil.Error:
            rss = 0
        peak = max(peak, rss)
        if peak > CAP:
            for child in measurer.children():
                child.kill()
    code, own_peak = json.loads(forker.stdout.readline())
    return code, out.read_text(errors="replace"), max(peak, own_peak)


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
def test_validate_refuses_a_hostile_scenario_in_one_line_within_the_memory_cap(forker, tmp_path, name, text, needles):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    check_one_line(*validate(forker, path, tmp_path), *needles)


def test_validate_refuses_a_personas_file_with_a_1_gib_line_without_reading_it(forker, tmp_path):
    personas = tmp_path / "p.jsonl"
    with personas.open("wb") as f:  # sparse: the line is 1 GiB long and takes no disk
        f.write(b'{"profile": {"education": "phd"}, "persona": {"description": "')
        f.truncate(1 << 30)
    scenario = tmp_path / "s.yaml"
    scenario.write_text("simulation: ratio-game\npopulation: {personas: p.jsonl}\n")
    check_one_line(*validate(forker, scenario, tmp_path), "p.jsonl:1: a persona of more than 65,536 bytes",
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
def test_results_refuses_a_hostile_reference_file_in_one_line_within_the_memory_cap(forker, tmp_path, name, make, needles):
    """Before, 1e19 and 1e300 raised OverflowError, the 300 MB field _csv.Error at 1.86 GB, and the
    6,000,000 rows were refused after 12.8 s and 1.9 GB. The reference is read before the database
    is opened, so none is needed."""
    path = tmp_path / name
    make(path)
    check_one_line(*measured(forker, tmp_path, "results", "last", "--db", str(tmp_path / "none.duckdb"), "--reference",
                             str(path)), *needles)
