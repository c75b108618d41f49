"""Issue #4 end to end with real processes (dummy model, so it is fast): a scenario with
personas and the CoT prompt runs 3 rounds; the recorder keeps profiles and the manifest;
`results --by`, `report` and `export` read it; a sweep runs a grid × seeds and compares seeds.
Every command runs in this process (the `cli` fixture): those that start a stack (demo, sweep,
rerun) still start nats-server and a process per service, as the product does; the console
script as a process is tests/e2e/test_cli.py's."""

from __future__ import annotations

import csv
import html as markup
import json
import re
import statistics
from pathlib import Path

import duckdb
import pytest
from scipy import stats

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
LEVELS = ["elementary school", "high school", "bachelor's", "master's", "Ph.D."]


WIDE = {"COLUMNS": "300"}  # rich tables: one line per row


def table_rows(stdout: str) -> dict[str, list[str]]:
    """A rich table's body rows as {first cell: the other cells}."""
    return {cells[0]: cells[1:] for line in stdout.splitlines() if line.startswith("│")
            for cells in [[c.strip() for c in line.strip("│").split("│")]]}


def mean_ci(values: list[float]) -> tuple[int, float, float, float]:
    """n, mean and its two-sided 95% Student-t interval, computed here (not by the code under test)."""
    n, mean = len(values), statistics.mean(values)
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(values) / n ** 0.5
    return n, mean, mean - half, mean + half


@pytest.fixture(scope="module")
def played(tmp_path_factory, cli):
    tmp = tmp_path_factory.mktemp("pop")
    res = cli("personas", "generate", str(ROOT / "examples/population/education.yaml"), "--count", "50",
                   "--model", "template", "--out", str(tmp / "personas.jsonl"))
    assert res.returncode == 0, res.stderr
    (tmp / "scenario.yaml").write_text(
        "name: edu-cot\nrounds: 3\n"
        "prompt: {system: strategies, answer: cot, population_note: true}\n"
        "population: {personas: personas.jsonl}\n"
        "model: {backend: dummy, latency_s: 0.01, seed: 3}\n")
    db = tmp / "p.duckdb"
    res = cli("demo", "--scenario", str(tmp / "scenario.yaml"), "--db", str(db), env=WIDE)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "recorded 150 outcomes (table guesses)" in res.stdout
    with duckdb.connect(str(db), read_only=True) as con:
        run_id = con.execute("SELECT run_id FROM runs").fetchone()[0]
    return tmp, db, run_id


def test_profiles_and_manifest_are_recorded(played):
    _, db, run_id = played
    with duckdb.connect(str(db), read_only=True) as con:
        counts = dict(con.execute("SELECT profile->>'education', count(*) FROM agent_profiles "
                                  "WHERE run_id = ? GROUP BY 1", [run_id]).fetchall())
        manifest = json.loads(con.execute("SELECT manifest_json FROM runs WHERE run_id = ?", [run_id]).fetchone()[0])
    assert counts == dict.fromkeys(LEVELS, 10)
    assert manifest["run_id"] == run_id and len(manifest["config_hash"]) == 64
    assert manifest["config"]["prompt"] == {"system": "strategies", "answer": "cot", "persona": True,
                                            "population_note": True}
    assert "The players are 50 people. Education: 20%" in manifest["prompt"]["system"]
    assert "step by step" in manifest["prompt"]["system"]
    assert manifest["population"]["count"] == 50 and manifest["population"]["mode"] == "template"
    assert manifest["seeds"]["model"] == 3 and manifest["software"]["packages"]["populace"]


def test_results_by_education_prints_cis(played, cli):
    _, db, run_id = played
    res = cli("results", run_id, "--by", "education", "--db", str(db), env=WIDE)
    assert res.returncode == 0, res.stderr
    # each level's row: valid answers, mean and its 95% CI across agents of the last round, computed
    # here from the recorded guesses and profiles
    with duckdb.connect(str(db), read_only=True) as con:
        guesses = con.execute("SELECT p.profile->>'education', g.value FROM guesses g JOIN agent_profiles p "
                              "USING (run_id, agent_id) WHERE g.run_id = ? AND g.round = 3 AND g.valid",
                              [run_id]).fetchall()
    printed = table_rows(res.stdout)
    assert set(printed) == set(LEVELS)
    for level in LEVELS:
        n, mean, low, high = mean_ci([v for lv, v in guesses if lv == level])
        assert printed[level][0] == str(n)
        assert printed[level][1] == f"{mean:.2f}" and printed[level][2] == f"[{low:.2f}, {high:.2f}]", level


def test_report_is_one_self_contained_html_with_the_three_figure_kinds(played, cli):
    tmp, db, run_id = played
    out = tmp / "report.html"
    res = cli("report", run_id, "--out", str(out), "--db", str(db))
    assert res.returncode == 0, res.stderr
    html = out.read_text()
    figures = [json.loads(markup.unescape(f)) for f in re.findall(r'<div class="plot"[^>]* data-figure="([^"]*)"', html)]
    assert len(figures) >= 3 and all(f["data"] for f in figures)  # Plotly figures, drawn by the inlined plotly.js
    assert html.count('<script id="plotly-js">') == 1
    for title in ("Guesses per round", "Mean guess per group", "Convergence over rounds"):
        assert title in html
    # the tables' numbers, computed here from the recorded guesses and profiles
    with duckdb.connect(str(db), read_only=True) as con:
        guesses = con.execute("SELECT g.round, p.profile->>'education', g.value FROM guesses g JOIN agent_profiles p "
                              "USING (run_id, agent_id) WHERE g.run_id = ? AND g.valid", [run_id]).fetchall()
    per_round = html[html.index("<h2>Per round</h2>"):html.index('<section id="figure-1">')]
    for rnd in (1, 2, 3):
        v = [x for r, _, x in guesses if r == rnd]
        assert (f"<tr><td>{rnd}</td><td>50</td><td>{len(v)}</td><td>0</td><td>0</td><td>{statistics.mean(v):.2f}</td>"
                f"<td>{statistics.median(v):.2f}</td><td>{statistics.stdev(v):.2f}</td>") in per_round, rnd
    by_level = html[html.index("By education (round 3)"):]
    for level in LEVELS:
        n, mean, low, high = mean_ci([x for r, lv, x in guesses if r == 3 and lv == level])
        assert (f'<td class="l">{level.replace(chr(39), "&#39;")}</td><td>{n}</td><td>{mean:.2f}</td>'
                f"<td>[{low:.2f}, {high:.2f}]</td>") in by_level, level
    start = html.index('<script id="plotly-js">')  # plotly.js's own source names URLs it never loads
    assert not re.search(r"(src|href)=\"https?://", html[:start] + html[html.index("</script>", start):])


def test_export_writes_parquet_of_every_table(played, cli):
    tmp, db, run_id = played
    res = cli("export", run_id, "--out", str(tmp / "export"), "--db", str(db))
    assert res.returncode == 0, res.stderr
    with duckdb.connect() as con:
        n = con.execute(f"SELECT count(*) FROM read_parquet('{tmp / 'export' / 'guesses.parquet'}')").fetchone()[0]
        profiles = con.execute(
            f"SELECT count(*) FROM read_parquet('{tmp / 'export' / 'agent_profiles.parquet'}')").fetchone()[0]
    assert (n, profiles) == (150, 50)
    assert {p.name for p in (tmp / "export").iterdir()} >= {"runs.parquet", "rounds.parquet", "llm_calls.parquet"}


def test_sweep_runs_grid_times_seeds_and_compares_seeds(played, tmp_path, cli):
    tmp, _, _ = played
    (tmp_path / "sweep.yaml").write_text(
        f"name: answers\nscenario: {tmp / 'scenario.yaml'}\nbase: {{rounds: 2}}\n"
        "grid: {prompt.answer: [direct, cot]}\nseeds: [1, 2]\n")
    db, out = tmp_path / "s.duckdb", tmp_path / "s.csv"
    res = cli("sweep", str(tmp_path / "sweep.yaml"), "--db", str(db), "--out", str(out), "--no-progress", env=WIDE)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 8 and {r["status"] for r in rows} == {"completed"}
    assert {(r["cell"], r["seed"]) for r in rows} == {(f"prompt.answer={a}", s) for a in ("direct", "cot")
                                                     for s in ("1", "2")}
    with duckdb.connect(str(db), read_only=True) as con:
        sweeps = con.execute("SELECT manifest_json->>'$.sweep.name', count(*) FROM runs GROUP BY 1").fetchall()
        seeds = [r[0] for r in con.execute("SELECT run_id FROM runs WHERE manifest_json->>'$.config.prompt.answer' "
                                           "= 'cot' ORDER BY run_id").fetchall()]
        # each run's last-round mean guess, as the recorder stored it (table rounds)
        last = con.execute("SELECT r.manifest_json->>'$.config.prompt.answer', s.mean FROM rounds s JOIN runs r "
                           "USING (run_id) WHERE s.round = 2").fetchall()
        guesses = con.execute("SELECT run_id, p.profile->>'education', g.value FROM guesses g JOIN agent_profiles p "
                              "USING (run_id, agent_id) WHERE g.round = 2 AND g.valid AND list_contains(?, run_id)",
                              [seeds]).fetchall()
    assert sweeps == [("answers", 4)]
    # the summary: per cell the mean of the two seeds' last-round means and its 95% CI across them
    summary = table_rows(res.stdout)
    for answer in ("direct", "cot"):
        values = [m for a, m in last if a == answer]
        assert len(values) == 2 and all(isinstance(v, float) for v in values)
        _, mean, low, high = mean_ci(values)
        runs, rnd, shown, ci, _ = summary[f"prompt.answer={answer}"]
        assert (runs, rnd) == ("2", "2")
        assert float(shown) == pytest.approx(mean, abs=0.005)
        lo, hi = (float(x) for x in ci.strip("[]").split(","))
        assert (lo, hi) == (pytest.approx(low, abs=0.005), pytest.approx(high, abs=0.005))
    res = cli("results", *seeds, "--by", "education", "--db", str(db), env=WIDE)
    assert res.returncode == 0, res.stderr
    # across runs: per level, the mean of the two runs' level means and its 95% CI across them
    by_level = table_rows(res.stdout)
    for level in LEVELS:
        run_means = [statistics.mean(v for rid, lv, v in guesses if rid == run and lv == level) for run in seeds]
        _, mean, low, high = mean_ci(run_means)
        runs, seed_mean, seed_ci = by_level[level][-3:]
        assert (runs, seed_mean, seed_ci) == ("2", f"{mean:.2f}", f"[{low:.2f}, {high:.2f}]"), level


def test_rerun_from_the_manifest_reproduces_the_rounds(played, cli):
    _, db, run_id = played
    res = cli("rerun", run_id, "--db", str(db), env=WIDE)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"of {run_id}" in res.stdout
    rows = [line for line in res.stdout.splitlines() if re.match(r"│\s+\d+ │", line)]
    assert len(rows) == 3 and all(line.rstrip().endswith("yes │") for line in rows), res.stdout
    with duckdb.connect(str(db), read_only=True) as con:
        got = con.execute("SELECT manifest_json->>'$.rerun_of' FROM runs WHERE run_id <> ?", [run_id]).fetchall()
    assert got == [(run_id,)]


def test_rerun_refuses_changed_personas(played, tmp_path, cli):
    """In process (the `cli` fixture): the refusal comes before anything starts."""
    tmp, db, run_id = played
    import shutil

    copy_db = tmp_path / "copy.duckdb"
    shutil.copy(db, copy_db)
    personas = tmp / "personas.jsonl"
    original = personas.read_bytes()
    try:
        personas.write_bytes(original.replace(b'"Ph.D."', b'"PhD"', 1))
        res = cli("rerun", run_id, "--db", str(copy_db))
    finally:
        personas.write_bytes(original)
    assert res.returncode == 2
    assert "population: personas.jsonl changed since the run" in res.stderr
    assert "starting nats-server" not in res.stderr
