"""populace.analysis against a real DuckDB file with the recorder's schema: tables checked
against numpy/scipy, the HTML report's content, Parquet round-trips, error messages.
No broker needed: rows are written directly, as the recorder would."""

from __future__ import annotations

import base64
import json
import re

import duckdb
import numpy as np
import pytest
from scipy import stats as st

from populace.analysis import (
    AnalysisError,
    attributes,
    convergence_table,
    export_parquet,
    group_table,
    render_report,
    round_table,
    write_report,
)
from populace.core.contracts import RunConfig
from populace.recorder.store import SCHEMA

EDU = ["elementary school", "high school", "bachelor's", "master's", "Ph.D."]
BASE = {"elementary school": 55.0, "high school": 48.0, "bachelor's": 40.0, "master's": 34.0, "Ph.D.": 25.0}
RUNS = ["edu-s1", "edu-s2"]
N_AGENTS = 60
N_ROUNDS = 3
EVIL_RAW = "<script>alert('x')</script> I think & so 42?"
NO_PROFILE = {58, 59}  # agents of edu-s2 without a profile row → group "(none)"


def _config(seed: int, population: bool) -> str:
    cfg = {"name": "education-cot", "agents": N_AGENTS, "rounds": N_ROUNDS, "seed": seed,
           "game": {"ratio": "2/3"}, "prompt": {"system": "basic", "answer": "cot"}}
    if population:
        cfg["population"] = {"personas": "personas.jsonl"}
    return RunConfig.model_validate(cfg).model_dump_json()


def _write_run(con, run_id: str, seed: int, population: bool = True, agents: int = N_AGENTS,
               rounds: int = N_ROUNDS, manifest: dict | None = None) -> None:
    rng = np.random.default_rng(seed)
    con.execute("INSERT INTO runs VALUES (?, TIMESTAMP '2024-07-01 10:00:00' + INTERVAL (?) MINUTE, "
                "TIMESTAMP '2024-07-01 11:00:00', ?, 'completed', NULL, ['h1'], ?)",
                [run_id, seed, _config(seed, population), json.dumps(manifest) if manifest else None])
    edu = [EDU[i % 5] for i in range(agents)]
    ages = rng.integers(18, 81, size=agents)
    for a in range(agents):
        con.execute("INSERT INTO agents VALUES (?, ?, 'h1', NULL)", [run_id, a])
        if population and not (run_id == "edu-s2" and a in NO_PROFILE):
            profile = {"education": edu[a], "age": int(ages[a])}
            persona = {"name": f"Agent {a}", "gender": "female" if a % 2 else "male", "age": int(ages[a]),
                       "description": f"A person with a {edu[a]} degree."}
            con.execute("INSERT INTO agent_profiles VALUES (?, ?, ?, ?, ?)",
                        [run_id, a, a, json.dumps(profile), json.dumps(persona)])
    for r in range(1, rounds + 1):
        vals: list[float | None] = []
        for a in range(agents):
            v = float(np.clip(BASE[edu[a]] * 0.7 ** (r - 1) + rng.normal(0, 8), 0, 100))
            vals.append(None if (a * 7 + r) % 23 == 0 else round(v, 1))
        for a, v in enumerate(vals):
            raw = (EVIL_RAW if a % 2 else "no idea") if v is None else f"My guess is {v}"
            con.execute("INSERT INTO guesses VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [run_id, r, a, v, v is not None, raw, 12.5])
            con.execute("INSERT INTO llm_calls VALUES (?, ?, ?, 'rep-0', 100, 20, 30.0, 1, ?, 'b1')",
                        [run_id, r, a, v is not None])
        valid = np.array([v for v in vals if v is not None])
        mean = float(valid.mean())
        target = 2 / 3 * mean
        ids = [a for a, v in enumerate(vals) if v is not None]
        win = ids[int(np.argmin(np.abs(valid - target)))]
        con.execute("INSERT INTO rounds VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, TIMESTAMP '2024-07-01 10:30:00')",
                    [run_id, r, len(valid), mean, target, win, vals[win], agents])


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("analysis") / "populace.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute(SCHEMA)
        manifest = {"config_sha256": "ab" * 32, "seeds": {"run": 1}, "packages": {"populace": "0.1.0"},
                    "prompt": {"version": "v1", "system": "You play <a> game & win"}}
        _write_run(con, "edu-s1", 1, manifest=manifest)
        _write_run(con, "edu-s2", 2)
        _write_run(con, "plain", 3, population=False, agents=10, rounds=1)
    return path


@pytest.fixture
def con(db):
    with duckdb.connect(str(db), read_only=True) as c:
        yield c


def _valid(con, run_id, round_):
    rows = con.execute("SELECT g.agent_id, g.value, p.profile->>'$.education' FROM guesses g "
                       "LEFT JOIN agent_profiles p USING (run_id, agent_id) "
                       "WHERE run_id = ? AND round = ? AND valid", [run_id, round_]).fetchall()
    return rows


def test_round_table_matches_numpy(con):
    table = round_table(con, "edu-s1")
    assert [r["round"] for r in table] == [1, 2, 3]
    for row in table:
        v = np.array([x[1] for x in _valid(con, "edu-s1", row["round"])])
        n_invalid = sum(1 for a in range(N_AGENTS) if (a * 7 + row["round"]) % 23 == 0)
        assert row["n"] == N_AGENTS and row["n_invalid"] == n_invalid and row["n_valid"] == v.size
        assert row["mean"] == pytest.approx(v.mean())
        assert row["median"] == pytest.approx(np.median(v))
        assert row["std"] == pytest.approx(v.std(ddof=1))
        assert (row["min"], row["max"]) == (pytest.approx(v.min()), pytest.approx(v.max()))
        assert row["target"] == pytest.approx(2 / 3 * v.mean())
        assert row["winner_value"] is not None and row["winner_agent_id"] is not None
    # the data get lower over rounds, as built
    assert table[0]["mean"] > table[-1]["mean"]


def test_group_table_one_run_matches_numpy_and_has_no_seed_ci(con):
    rows = group_table(con, ["edu-s1"], "education")
    assert [r["group"] for r in rows] == EDU  # ordered by education level, not alphabetically
    valid = _valid(con, "edu-s1", N_ROUNDS)  # default: the last round
    for row in rows:
        v = np.array([x[1] for x in valid if x[2] == row["group"]])
        half = st.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size)
        assert row["n"] == v.size
        assert row["mean"] == pytest.approx(v.mean())
        assert row["ci_low"] == pytest.approx(v.mean() - half)
        assert row["ci_high"] == pytest.approx(v.mean() + half)
        assert row["run_means"] is None and row["seed_ci_low"] is None and row["seed_mean"] is None
    assert rows[0]["mean"] > rows[-1]["mean"]  # Ph.D. below elementary school, as built
    r1 = group_table(con, "edu-s1", "education", round=1)
    assert r1[0]["n"] == sum(1 for x in _valid(con, "edu-s1", 1) if x[2] == EDU[0])
    assert r1[0]["mean"] != rows[0]["mean"]


def test_group_table_two_runs_has_ci_across_seeds(con):
    rows = group_table(con, RUNS, "education")
    assert [r["group"] for r in rows] == EDU + ["(none)"]
    assert rows[-1]["n"] == sum(1 for x in _valid(con, "edu-s2", N_ROUNDS) if x[0] in NO_PROFILE)
    for row in rows[:-1]:
        per_run = {rid: np.array([x[1] for x in _valid(con, rid, N_ROUNDS) if x[2] == row["group"]])
                   for rid in RUNS}
        pooled = np.concatenate(list(per_run.values()))
        assert row["n"] == pooled.size and row["mean"] == pytest.approx(pooled.mean())
        means = np.array([per_run[rid].mean() for rid in RUNS])
        assert row["run_means"] == {rid: pytest.approx(m) for rid, m in zip(RUNS, means)}
        half = st.t.ppf(0.975, 1) * means.std(ddof=1) / np.sqrt(2)
        assert row["seed_mean"] == pytest.approx(means.mean())
        assert row["seed_ci_low"] == pytest.approx(means.mean() - half)
        assert row["seed_ci_high"] == pytest.approx(means.mean() + half)
        assert row["n_runs"] == 2


def test_group_by_numeric_and_persona_attributes(con):
    ages = group_table(con, ["edu-s1"], "age")
    labels = [r["group"] for r in ages]
    assert all(re.fullmatch(r"\d\d-\d\d|80\+", lab) for lab in labels), labels
    assert labels == sorted(labels, key=lambda s: int(s[:2]))
    assert sum(r["n"] for r in ages) == len(_valid(con, "edu-s1", N_ROUNDS))
    gender = group_table(con, ["edu-s1"], "gender")  # only in the persona, not the profile
    assert [r["group"] for r in gender] == ["female", "male"]
    assert attributes(con, "edu-s1") == ["education", "age"]
    assert attributes(con, "plain") == []


def test_convergence_table(con):
    rows = convergence_table(con, RUNS)
    assert [(r["run_id"], r["round"]) for r in rows] == [(rid, k) for rid in RUNS for k in (1, 2, 3)]
    for r in rows:
        assert r["equilibrium"] == 0.0
        assert r["distance"] == pytest.approx(abs(r["mean"]))


def test_errors_name_the_unknown_run_and_attribute(con):
    with pytest.raises(AnalysisError, match=r"run 'nope' is not in .*populace\.duckdb.*known runs:.*edu-s1"):
        round_table(con, "nope")
    with pytest.raises(AnalysisError, match=r"'nope'"):
        group_table(con, ["edu-s1", "nope"], "education")
    with pytest.raises(AnalysisError, match=r"'shoe_size'.*available: education, age, name, gender"):
        group_table(con, ["edu-s1"], "shoe_size")
    with pytest.raises(AnalysisError, match=r"round 9 is not in run 'edu-s1' \(rounds 1..3\)"):
        group_table(con, ["edu-s1"], "education", round=9)
    with pytest.raises(AnalysisError, match="no population"):
        group_table(con, ["plain"], "education")
    with pytest.raises(ValueError):  # AnalysisError is a ValueError
        render_report(con, "edu-s1", by=["shoe_size"])


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def test_report_is_self_contained_with_all_figures(con, tmp_path):
    page = render_report(con, "edu-s1")
    images = _images(page)
    assert len(images) >= 3 and all(img.startswith(b"\x89PNG\r\n\x1a\n") for img in images)
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; I think &amp; so 42?" in page
    assert "2/3" in page and "education-cot" in page and "answer=cot" in page and "completed" in page
    for title in ("Figure 1", "Figure 2", "Figure 3", "By education", "By age", "Invalid answers"):
        assert title in page
    # the manifest, pretty-printed and escaped, inside <details>
    details = page[page.index("<details>"):]
    assert "config_sha256" in details and "You play &lt;a&gt; game &amp; win" in details
    for g in EDU:
        assert f">{g.replace(chr(39), '&#x27;')}<" in page
    out = write_report(con, "edu-s1", tmp_path / "sub" / "report.html", by="education")
    assert out.read_text(encoding="utf-8").count("data:image/png;base64,") >= 3


def test_report_without_population_or_manifest(con):
    page = render_report(con, "plain")
    assert len(_images(page)) == 2  # histograms and convergence; no groups to plot
    assert "no population profiles" in page and "No manifest" in page


def test_parquet_export_round_trips(con, tmp_path):
    paths = export_parquet(con, RUNS, tmp_path / "pq")
    assert sorted(p.name for p in paths) == sorted(
        f"{t}.parquet" for t in ("runs", "agents", "agent_profiles", "guesses", "rounds", "llm_calls"))
    expect = {"runs": 2, "agents": 2 * N_AGENTS, "agent_profiles": 2 * N_AGENTS - len(NO_PROFILE),
              "guesses": 2 * N_AGENTS * N_ROUNDS, "rounds": 2 * N_ROUNDS, "llm_calls": 2 * N_AGENTS * N_ROUNDS}
    for p in paths:
        table = p.stem
        n, runs = duckdb.execute(f"SELECT count(*), list(DISTINCT run_id ORDER BY run_id) FROM read_parquet('{p}')"
                                 ).fetchone()
        assert n == expect[table], table
        assert runs == RUNS
    mean = duckdb.execute(f"SELECT avg(value) FROM read_parquet('{tmp_path / 'pq' / 'guesses.parquet'}') "
                          "WHERE run_id = 'edu-s1' AND round = 3").fetchone()[0]
    assert mean == pytest.approx(round_table(con, "edu-s1")[2]["mean"])
    with pytest.raises(AnalysisError, match="'ghost'"):
        export_parquet(con, ["ghost"], tmp_path / "pq2")
