"""The files a start form names (populace.manager.scenarios): every field marked SCENARIO_FILE is
found, each is checked against the manager's working directory before anything is read
(absolute, '~' and '..' refused as written; symbolic links followed; a FIFO or a folder
refused), and an error about a file never shows what the file holds."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from populace.core.contracts import SCENARIO_FILE, RunConfig
from populace.core.scenario import ScenarioError
from populace.graph.config import GENERATORS
from populace.manager import scenarios
from populace.manager.views import FieldError

SECRET = "s3cret-value"


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    outside, work = tmp_path / "outside", tmp_path / "work"
    outside.mkdir()
    work.mkdir()
    (outside / "secret.jsonl").write_text(f'{{"profile": {{"k": "{SECRET}"}}}}\n')
    (work / "p.jsonl").write_text('{"profile": {"age": 30}}\n')
    (work / "sub").mkdir()
    (work / "sub" / "edges.csv").write_text("source,target\n0,1\n")
    (work / "in.jsonl").symlink_to(work / "p.jsonl")
    (work / "out.jsonl").symlink_to(outside / "secret.jsonl")
    (work / "loop.jsonl").symlink_to(work / "loop.jsonl")
    os.mkfifo(work / "fifo.jsonl")
    monkeypatch.chdir(work)
    return work.resolve()


@pytest.mark.parametrize("path", ["p.jsonl", "./p.jsonl", "sub/edges.csv", "in.jsonl"])
def test_a_regular_file_under_the_working_directory_is_allowed(root, path):
    assert scenarios.confine("population.personas", path, root).is_relative_to(root)


@pytest.mark.parametrize(("path", "says"), [
    ("/etc/passwd", "relative path without '..'"),
    ("~/p.jsonl", "relative path without '..'"),
    ("../outside/secret.jsonl", "relative path without '..'"),
    ("sub/../p.jsonl", "relative path without '..'"),  # '..' is refused even when it stays inside
    ("out.jsonl", "a link that leads outside"),
    ("loop.jsonl", "cannot be resolved"),
    ("fifo.jsonl", "not a regular file"),  # reading a FIFO would block the form for good
    ("sub", "not a regular file"),
    ("missing.jsonl", "no such file"),
    ("p\0.jsonl", "cannot be resolved"),
])
def test_anything_else_is_refused_naming_the_field_before_it_is_read(root, path, says):
    with pytest.raises(ScenarioError) as err:
        scenarios.confine("population.personas", path, root)
    assert str(err.value).startswith(f"population.personas: {path!r}: ") and says in str(err.value)


def test_every_file_field_of_the_run_and_its_graph_is_found():
    config = RunConfig.model_validate({"agents": 20, "population": {"personas": "p.jsonl"},
                                       "graph": {"generator": "edges", "path": "sub/edges.csv"}})
    assert scenarios.scenario_files(config) == {"population.personas": "p.jsonl", "graph.path": "sub/edges.csv"}
    config = RunConfig.model_validate({"agents": 20, "population": {"config": "pop.yaml"}})
    assert scenarios.scenario_files(config) == {"population.config": "pop.yaml"}
    assert scenarios.scenario_files(RunConfig(agents=20)) == {}


def _string_fields(schema: dict, defs: dict, prefix: str = ""):
    for key, prop in schema.get("properties", {}).items():
        for option in prop.get("anyOf", [prop]):
            if "$ref" in option:
                yield from _string_fields(defs[option["$ref"].rsplit("/", 1)[-1]], defs, f"{prefix}{key}.")
            elif option.get("type") == "string":
                yield f"{prefix}{key}", prop


def test_a_field_that_names_a_file_is_marked_so_the_manager_checks_it():
    """A guard for the next file field: one whose name or description speaks of a file is marked."""
    schemas = [("", RunConfig.model_json_schema())] + [("graph.", m.model_json_schema()) for m in GENERATORS.values()]
    named, marked = set(), set()
    for prefix, schema in schemas:
        for name, prop in _string_fields(schema, schema.get("$defs", {}), prefix):
            text = f"{name} {prop.get('description', '')}"
            if re.search(r"file|path|yaml|jsonl|csv|parquet", text, re.IGNORECASE):
                named.add(name)
            if prop.get("format") == SCENARIO_FILE["format"]:
                marked.add(name)
    assert named == marked == {"population.personas", "population.config", "graph.path"}


def test_a_file_that_cannot_be_used_is_named_without_its_content(root):
    (root / "bad.jsonl").write_text(f'{{"profile": "{SECRET}"}}\n{SECRET}: not json\n')
    (root / "pop.yaml").write_text(f"total: 10\nattributes:\n  {SECRET}: [broken\n")
    (root / "bad.csv").write_text(f"{SECRET},x\n1,2\n")
    for section, field, path in (("population: {personas: bad.jsonl}", "population.personas", "bad.jsonl"),
                                 ("population: {config: pop.yaml}", "population.config", "pop.yaml"),
                                 ("graph: {generator: edges, path: bad.csv}", "graph.path", "bad.csv")):
        checked = scenarios.validate(f"agents: 20\nrounds: 1\n{section}\n")
        assert [e.field for e in checked.errors] == [field], checked.errors
        message = checked.errors[0].message
        assert repr(path) in message and "populace validate" in message
        assert SECRET not in message and str(root) not in message


def test_errors_about_the_scenario_itself_are_shown_whole():
    files = {"graph.path": "e.csv"}
    errors = [FieldError("graph.path", "graph.path: /abs/e.csv: columns must be … (got s3cret)"),
              FieldError("agents", "agents: 20, but population.personas p.jsonl has 19 personas"),
              FieldError("root", "root: x:0:0 (a line of a file that reads like a field)"),
              FieldError("", "a line naming nothing")]
    out = scenarios.without_file_content(errors, files, {"agents", "graph", "population"})
    assert [e.field for e in out] == ["graph.path", "agents", ""]  # the two loose lines are one
    assert out[1] == errors[1]
    assert all("s3cret" not in e.message and "x:0:0" not in e.message for e in out)
