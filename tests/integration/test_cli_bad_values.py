"""Every CLI path refuses a bad value with one line naming the flag and exit 2, before it starts
anything or writes anything: a `--by` that names no attribute, a run or DuckDB file that is not
there, an output path that cannot be written, a taken port, a simulation to compare with that is
not installed. In process (the `cli` fixture) on one run recorded by `populace run --local`."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import duckdb
import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WIDE = {"COLUMNS": "300"}
ATTRIBUTES = "education, age, gender, name, description"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, cli) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("bad-values")
    (tmp / "scenario.yaml").write_text(
        f"name: t\nagents: 40\nrounds: 2\npopulation: {{config: {ROOT / 'examples/population/education.yaml'}}}\n"
        "model: {backend: dummy, latency_s: 0}\n")
    db = tmp / "r.duckdb"
    res = cli("run", tmp / "scenario.yaml", "--local", "--db", db, "--no-progress")
    assert res.returncode == 0, res.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        (run_id,) = con.execute("SELECT run_id FROM runs").fetchone()
    return db, run_id


def refused(res: subprocess.CompletedProcess, starts: str) -> str:
    """The one line of a refusal (exit 2), which must start with `error: <starts>`."""
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, (res.returncode, res.stderr, res.stdout)
    assert len(lines) == 1 and lines[0].startswith(f"error: {starts}"), res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_by_that_names_no_attribute_is_refused_naming_the_flag_and_the_attributes(cli, recorded, tmp_path):
    db, run_id = recorded
    for args in (["results", run_id, "--by", "nosuchcolumn"], ["results", run_id, "--json", "--by", "nosuchcolumn"],
                 ["report", run_id, "--by", "education", "--by", "nosuchcolumn", "--out", tmp_path / "r.html"]):
        line = refused(cli(*args, "--db", db, env=WIDE), "--by: 'nosuchcolumn' is not an attribute")
        assert line.endswith(f"run(s) {run_id} ({ATTRIBUTES})"), line
    assert not (tmp_path / "r.html").exists()


def test_a_run_or_a_database_that_is_not_there_is_refused(cli, recorded, tmp_path):
    db, run_id = recorded
    assert f"'nosuchrun' is not in {db}; known runs: {run_id}" in refused(
        cli("results", "nosuchrun", "--db", db, env=WIDE), "run 'nosuchrun'")
    refused(cli("results", run_id, "--db", tmp_path / "none.duckdb", env=WIDE), "--db: ")
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    for path in (text, tmp_path):
        refused(cli("results", run_id, "--db", path, env=WIDE), f"--db: {path} is not a DuckDB database file")
        refused(cli("export", run_id, "--db", path, "--out", tmp_path / "x", env=WIDE), "--db: ")


def test_a_run_named_twice_counts_once(cli, recorded):
    db, run_id = recorded
    res = cli("results", run_id, "last", "--by", "education", "--db", db, env=WIDE)
    assert res.returncode == 0, res.stderr
    assert f"last round — {run_id}\n" in res.stdout or f"last round — {run_id} " in res.stdout, res.stdout
    assert "runs" not in res.stdout  # one run: no columns across runs


def test_an_output_path_that_cannot_be_written_is_refused_before_anything_is_read(cli, recorded, tmp_path):
    db, run_id = recorded
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    refused(cli("report", run_id, "--db", db, "--out", tmp_path), f"--out: {tmp_path} is a folder")
    refused(cli("report", run_id, "--db", db, "--out", a_file / "r.html"), f"--out: {a_file} is a file, not a folder")
    refused(cli("export", run_id, "--db", db, "--out", a_file), f"--out: {a_file} is a file; give a folder")
    refused(cli("personas", "generate", ROOT / "examples/population/education.yaml", "--out", tmp_path,
                "--count", "3"), f"--out: {tmp_path} is a folder")
    refused(cli("sweep", ROOT / "examples/sweeps/ratios.yaml", "--dry-run", "--out", tmp_path / "r.xlsx"),
            f"--out: {tmp_path / 'r.xlsx'} must end in .csv or .parquet")
    refused(cli("bench", "dummy", "--agents", "10", "--out", tmp_path), f"--out: {tmp_path} is a folder")
    refused(cli("node", "--nats", "nats://127.0.0.1:1", "--log-dir", a_file), f"--log-dir: {a_file} is a file")
    assert a_file.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_database_a_recorder_would_write_is_checked_before_anything_starts(cli, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    scenario = ROOT / "examples/guess-two-thirds.yaml"
    refused(cli("run", scenario, "--local", "--db", a_file, "--no-progress"),
            f"--db: {a_file} is not a DuckDB database file")
    for args in (["demo", "--agents", "10"], ["up", "--port", str(free_port())], ["manager", "--port", str(free_port())]):
        res = cli(*args, "--db", a_file / "x.duckdb")
        refused(res, f"--db: {a_file} is a file, not a folder")
        assert "starting nats-server" not in res.stdout + res.stderr
    assert a_file.read_text() == "x"


def test_a_taken_port_is_refused_instead_of_joining_what_listens_there(cli, tmp_path, taken_port):
    refused(cli("up", "--port", str(taken_port), "--db", tmp_path / "u.duckdb", "--temporary-store"),
            f"--port: cannot listen on 127.0.0.1:{taken_port} (Address already in use)")
    refused(cli("manager", "--nats", "nats://127.0.0.1:1", "--port", str(taken_port)),
            f"--host, --port: cannot listen on 127.0.0.1:{taken_port}")
    assert list(tmp_path.iterdir()) == []


def test_a_simulation_to_compare_with_is_checked_before_the_first_bench(cli):
    res = cli("bench", "dummy", "--agents", "10", "--compare", "nosuch")
    refused(res, "--compare: simulation: unknown simulation 'nosuch'")
    assert "stack ready" not in res.stdout + res.stderr
    # the same study with one key changed: that key is checked against the study's own before the first bench
    res = cli("bench", "dummy", "--agents", "10", "--simulation", "feed", "--compare-set", "recommender.record_shown=3")
    refused(res, "--compare-set: recommender.record_shown: Input should be a valid boolean")
    assert "stack ready" not in res.stdout + res.stderr
