"""populace.analysis on the ratio game, against a real DuckDB file written by the recorder's
`Store` (the ratio game keeps its historic tables `guesses` and `rounds`): tables checked
against numpy/scipy, the HTML report's content, Parquet round-trips, error messages; and a
database from before simulations were pluggable (no `tables_json`), read as the ratio game.
No broker needed: the recorder's events are ingested directly."""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime

import duckdb
import numpy as np
import pytest
from populace_ratio_game import RatioGame
from scipy import stats as st
from typer.testing import CliRunner

from populace.analysis import (
    LEGACY_TABLES,
    AnalysisError,
    attributes,
    convergence_table,
    export_parquet,
    fork_table,
    group_table,
    render_report,
    round_table,
    run_info,
    write_report,
)
from populace.analysis.report import runs_named
from populace.core.contracts import (
    ConfigRef,
    LlmCallBatch,
    OutcomeBatch,
    RoundResult,
    RunConfig,
    RunDone,
    RunStarted,
    SpawnBatch,
    Usage,
)
from populace.store.store import Event, Store

EDU = ["elementary school", "high school", "bachelor's", "master's", "Ph.D."]
BASE = {"elementary school": 55.0, "high school": 48.0, "bachelor's": 40.0, "master's": 34.0, "Ph.D.": 25.0}
RUNS = ["edu-s1", "edu-s2"]
N_AGENTS = 60
N_ROUNDS = 3
EVIL_RAW = "<script>alert('x')</script> I think & so 42?"
NO_PROFILE = {58, 59}  # agents of edu-s2 with an empty profile and no education → group "(none)"
T0 = datetime(2024, 7, 1, 10, 0, tzinfo=UTC).timestamp()


def _config(seed: int, population: bool, agents: int, rounds: int) -> RunConfig:
    cfg = {"name": "education-cot", "agents": agents, "rounds": rounds, "seed": seed,
           "game": {"ratio": "2/3"}, "prompt": {"system": "basic", "answer": "cot"}}
    if population:
        cfg["population"] = {"personas": "personas.jsonl"}
    return RunConfig.model_validate(cfg)


def _personas(run_id: str, edu: list[str], ages: np.ndarray) -> bytes:
    lines = []
    for a, level in enumerate(edu):
        if run_id == "edu-s2" and a in NO_PROFILE:
            rec = {"profile": {}, "persona": {"name": f"Agent {a}"}}
        else:
            rec = {"profile": {"education": level, "age": int(ages[a])},
                   "persona": {"name": f"Agent {a}", "gender": "female" if a % 2 else "male", "age": int(ages[a]),
                               "description": f"A person with a {level} degree."}}
        lines.append(json.dumps(rec))
    return "\n".join(lines).encode()


def _write_run(store: Store, run_id: str, seed: int, population: bool = True, agents: int = N_AGENTS,
               rounds: int = N_ROUNDS, manifest: dict | None = None, first_round: int = 1) -> None:
    """One ratio-game run, as the recorder receives it: started, spawned, outcome batches, LLM
    calls and the environment's round results, done."""
    rng = np.random.default_rng(seed)
    cfg = _config(seed, population, agents, rounds)
    edu = [EDU[i % 5] for i in range(agents)]
    ages = rng.integers(18, 81, size=agents)
    events = [Event(f"{run_id}.started", "started",
                    RunStarted(run_id=run_id, config=cfg, started_at=T0 + 60 * seed, hosts=["h1"],
                               tables=RatioGame.tables(), manifest=manifest),
                    blob=_personas(run_id, edu, ages) if population else None),
              Event(f"{run_id}.spawn", "spawn", SpawnBatch(run_id=run_id, host_id="h1", ranges=[(0, agents)],
                                                           config_ref=ConfigRef.of(cfg)))]
    ids = list(range(agents))
    for r in range(first_round, rounds + 1):
        vals: list[float | None] = []
        for a in ids:
            v = float(np.clip(BASE[edu[a]] * 0.7 ** (r - 1) + rng.normal(0, 8), 0, 100))
            vals.append(None if (a * 7 + r) % 23 == 0 else round(v, 1))
        raws = [(EVIL_RAW if a % 2 else "no idea") if v is None else f"My guess is {v}" for a, v in enumerate(vals)]
        valid = [v is not None for v in vals]
        # some invalid rows are the simulation's own bugs, not the model's answers (issue 25)
        errors = [f"agent: ValueError: agent {a} has a bug" if not ok and _bug(a) else None
                  for a, ok in enumerate(valid)]
        events.append(Event(f"{run_id}.{r}.outcomes", "outcomes", OutcomeBatch(
            run_id=run_id, round=r, host_id="h1", seq=0, agent_ids=ids, columns={"value": vals}, valid=valid,
            raws=raws, latency_ms=[12.5] * agents, errors=errors)))
        events.append(Event(f"{run_id}.{r}.calls", "llm", LlmCallBatch(
            run_id=run_id, round=r, batch_id="b1", agent_ids=ids, replicas=["rep-0"] * agents,
            prompt_tokens=[100] * agents, completion_tokens=[20] * agents, latency_ms=[30.0] * agents,
            attempts=[1] * agents, valid=valid)))
        good = np.array([v for v in vals if v is not None])
        mean = float(good.mean())
        target = 2 / 3 * mean
        valid_ids = [a for a, v in enumerate(vals) if v is not None]
        win = valid_ids[int(np.argmin(np.abs(good - target)))]
        events.append(Event(f"{run_id}.{r}.result", "round.result", RoundResult(
            run_id=run_id, round=r, n=agents, n_valid=len(good),
            summary={"mean": mean, "target": target, "winner_agent_id": win, "winner_value": vals[win],
                     "n_winners": 1},
            observation={}, closed_at=T0 + 1800,
            usage=Usage(llm_calls=agents, prompt_tokens=100 * agents, completion_tokens=20 * agents,
                        infra_retries=r - 1, cached_tokens=40 * agents, dollars=0.25 * r))))
    events.append(Event(f"{run_id}.done", "done", RunDone(run_id=run_id, status="completed", rounds=rounds,
                                                          finished_at=T0 + 3600)))
    store.ingest(events)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("analysis") / "populace.duckdb"
    store = Store(path)
    manifest = {"config_sha256": "ab" * 32, "seeds": {"run": 1}, "packages": {"populace": "0.1.0"},
                "prompt": {"version": "v1", "system": "You play <a> game & win"}}
    _write_run(store, "edu-s1", 1, manifest=manifest)
    _write_run(store, "edu-s2", 2, manifest={"sweep": {"id": "sweep-1", "name": "seeds"}})
    _write_run(store, "plain", 3, population=False, agents=10, rounds=1)
    _write_run(store, "tiny", 5, agents=10, rounds=2,  # two agents per education level
               manifest={"sweep": {"id": "sweep-1", "name": "seeds"}})
    _write_run(store, "edu-s1-fork", 4, manifest={"fork": {"parent": "edu-s1", "after_round": 1,
                                                            "changes": {"game": {"ratio": "1/2"}}}}, first_round=2)
    store.close()
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


def _bug(agent: int) -> bool:
    """Whether an invalid row of `agent` is its simulation's error (else the model's answer)."""
    return agent % 3 == 0


def _invalid(round_: int, bugs: bool | None = None) -> int:
    """Invalid rows of a round of the fixture: all, the simulation's errors or the model's answers."""
    return sum(1 for a in range(N_AGENTS) if (a * 7 + round_) % 23 == 0 and (bugs is None or _bug(a) == bugs))


def test_round_table_matches_numpy(con):
    table = round_table(con, "edu-s1")
    assert [r["round"] for r in table] == [1, 2, 3]
    for row in table:
        v = np.array([x[1] for x in _valid(con, "edu-s1", row["round"])])
        n_invalid = sum(1 for a in range(N_AGENTS) if (a * 7 + row["round"]) % 23 == 0)
        assert row["n"] == N_AGENTS and row["n_invalid"] == n_invalid and row["n_valid"] == v.size
        # three classes: the model's invalid answers and the simulation's own errors apart
        assert (row["n_invalid_answers"], row["n_simulation_errors"]) == (_invalid(row["round"], False),
                                                                          _invalid(row["round"], True))
        assert row["n_simulation_errors"] > 0 and row["n_invalid_answers"] > 0
        assert row["mean"] == pytest.approx(v.mean())
        assert row["median"] == pytest.approx(np.median(v))
        assert row["std"] == pytest.approx(v.std(ddof=1))
        assert (row["min"], row["max"]) == (pytest.approx(v.min()), pytest.approx(v.max()))
        # the environment's round result, as its simulation declared the columns
        assert row["summary"]["target"] == pytest.approx(2 / 3 * v.mean())
        assert row["summary"]["mean"] == pytest.approx(v.mean())
        assert row["summary"]["winner_value"] is not None and row["summary"]["winner_agent_id"] is not None
        assert "options" not in row  # a numeric measure has no shares
        # the round's LLM work, infrastructure retries apart from the model's invalid answers
        assert row["usage"] == {"llm_calls": N_AGENTS, "prompt_tokens": 100 * N_AGENTS,
                                "completion_tokens": 20 * N_AGENTS, "infra_retries": row["round"] - 1,
                                "cached_tokens": 40 * N_AGENTS, "dollars": 0.25 * row["round"]}
    # the data get lower over rounds, as built
    assert table[0]["mean"] > table[-1]["mean"]


def test_run_info_reads_the_ratio_game_from_its_tables_and_class(con):
    assert RatioGame.tables() == LEGACY_TABLES  # old databases are read with the game's real tables
    info = run_info(con, "edu-s1")
    assert (info["simulation"], info["outcome_table"], info["summary_table"]) == ("ratio-game", "guesses", "rounds")
    assert (info["measure"], info["measure_kind"], info["grouped"], info["noun"]) == ("value", "numeric", False, "guess")
    assert info["loaded"] and info["note"] is None and not info["legacy"]
    assert info["equilibrium"] == 0.0 and info["measure_range"] == [0.0, 100.0]
    assert info["reference_columns"] == ["target"] and info["trend_columns"] == ["target", "winner_value"]
    assert info["labels"]["winner_value"] == "winning number"  # the Summary field's title
    assert info["description"] == "target = 2/3 · mean; guesses in [0, 100]"  # the simulation's own words
    invalid = sum(1 for r in range(1, N_ROUNDS + 1) for a in range(N_AGENTS) if (a * 7 + r) % 23 == 0)
    assert info["usage"] == {"llm_calls": N_AGENTS * N_ROUNDS, "prompt_tokens": 100 * N_AGENTS * N_ROUNDS,
                             "completion_tokens": 20 * N_AGENTS * N_ROUNDS, "infra_retries": 0 + 1 + 2,
                             "cached_tokens": 40 * N_AGENTS * N_ROUNDS, "dollars": 0.25 * (1 + 2 + 3),
                             "invalid_answers": sum(_invalid(r, False) for r in range(1, N_ROUNDS + 1)),
                             "simulation_errors": sum(_invalid(r, True) for r in range(1, N_ROUNDS + 1))}
    assert info["usage"]["invalid_answers"] + info["usage"]["simulation_errors"] == invalid


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


def _figures(page: str) -> list[dict]:
    """The report's figures: each plot's Plotly JSON (its data-figure attribute, unescaped)."""
    return [json.loads(html.unescape(m)) for m in re.findall(r'<div class="plot"[^>]* data-figure="([^"]*)"', page)]


def _own_markup(page: str) -> str:
    """The page without the inlined plotly.js bundle (whose source names URLs it never loads)."""
    start = page.index('<script id="plotly-js">')
    return page[:start] + page[page.index("</script>", start):]


def _traces(figure: dict, name: str) -> list[dict]:
    return [t for t in figure["data"] if t.get("name") == name]


def test_report_is_self_contained_with_all_figures(con, tmp_path):
    page = render_report(con, "edu-s1")
    figures = _figures(page)
    assert len(figures) == 3 and all(f["data"] for f in figures)
    assert page.count('<script id="plotly-js">') == 1  # plotly.js inlined once, for every figure
    assert "<script src" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r"https?://", _own_markup(page))  # no URL outside plotly.js's own source
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; I think &amp; so 42?" in page
    assert "2/3" in page and "education-cot" in page and "answer=cot" in page and "completed" in page
    for title in ("Figure 1. Guesses per round", "Figure 2. Mean guess per group", "Figure 3. Convergence over rounds",
                  "By education", "By age", "Invalid answers", "Raw answers per agent"):
        assert title in page
    assert "Figure 4" not in page  # the ratio game has no groups of players
    # what the rounds cost: the header's LLM work line and the per-round table's cost columns
    assert "$1.50 at the models&#39; prices" in page and "<th>cached tokens</th><th>dollars</th>" in page
    # the target is drawn in every histogram, target and winning number over rounds
    assert 'aria-label="Histogram of guesses per round with the target"' in page
    assert 'aria-label="Mean, median, target, winning number per round"' in page
    hist, groups, conv = figures
    assert len(_traces(hist, "target")) == N_ROUNDS and len(_traces(hist, "equilibrium 0")) == N_ROUNDS
    assert [t["name"] for t in conv["data"]] == ["mean", "median", "target", "winning number"]
    assert [s["y0"] for s in conv["layout"]["shapes"]] == [0]  # the equilibrium line …
    assert conv["layout"]["yaxis"]["range"][0] < 0  # … off the axis's edge
    assert groups["layout"]["legend"]["y"] > 1  # legends sit above the plots, over no bar
    assert "<th>winning number</th>" in page and "<th>target</th>" in page
    assert "<td>equilibrium</td><td>0</td>" in page
    # the per-round tables' numbers, from the recorded guesses (numpy here) and the fixture's usage
    rounds = page[page.index("<h2>Per round</h2>"):page.index('<section id="figure-1">')]
    for r in range(1, N_ROUNDS + 1):
        v = np.array([x[1] for x in _valid(con, "edu-s1", r)])
        model, bugs = _invalid(r, False), _invalid(r, True)
        assert (f"<tr><td>{r}</td><td>{N_AGENTS}</td><td>{len(v)}</td><td>{model}</td><td>{bugs}</td>"
                f"<td>{v.mean():.2f}</td><td>{np.median(v):.2f}</td><td>{v.std(ddof=1):.2f}</td>"
                f"<td>{v.min():.2f}</td><td>{v.max():.2f}</td><td>{2 / 3 * v.mean():.2f}</td>") in rounds, r
        # invalid answers (model), infra retries (r - 1 in the fixture), LLM calls, re-asks and replica retries
        # (not counted by this fixture's calls), prompt and completion tokens, latency p50 / p95 / max
        assert (f"<tr><td>{r}</td><td>{model}</td><td>{r - 1}</td><td>{N_AGENTS}</td><td>—</td><td>—</td>"
                f"<td>{100 * N_AGENTS:,}</td><td>{20 * N_AGENTS:,}</td>" + "<td>30.00</td>" * 3) in rounds, r
    # the model's invalid answers and the infrastructure's retries are counted apart
    errors = sum(_invalid(r, True) for r in range(1, N_ROUNDS + 1))
    answers_invalid = sum(_invalid(r, False) for r in range(1, N_ROUNDS + 1))
    assert (f"{answers_invalid:,} invalid answers (the model&#39;s answer could not be read), {errors:,} simulation "
            "errors (the simulation&#39;s own code failed") in page
    assert "<th>invalid answers</th>" in page and "<th>simulation errors</th>" in page
    assert "3 infrastructure retries (prompts asked again because no model answered" in page
    assert "<th>infra retries</th>" in page and "<th>prompt tokens</th>" in page
    assert "<th>re-asks</th>" in page and "<th>latency p50 (ms)</th>" in page  # from the gateway's llm_calls
    # every invalid answer with its raw text, not five; every valid one per agent
    invalid = sum(1 for r in range(1, N_ROUNDS + 1) for a in range(N_AGENTS) if (a * 7 + r) % 23 == 0)
    table = page[page.index('id="invalid-answers"'):page.index('id="reasoning"')]
    assert table.count("<tr data-agent=") == invalid
    assert f"{answers_invalid:,} invalid answer(s) in this run, and {errors:,} simulation error(s)" in page
    answers = page[page.index('id="reasoning"'):]
    assert answers.count("<tr data-agent=") == N_AGENTS * N_ROUNDS - invalid
    assert "My guess is" in answers and "education: Ph.D." in answers
    # the manifest, pretty-printed and escaped, inside <details>
    details = page[page.index("<details>"):]
    assert "config_sha256" in details and "You play &lt;a&gt; game &amp; win" in details
    for g in EDU:
        assert f">{g.replace(chr(39), '&#39;')}<" in page
    out = write_report(con, "edu-s1", tmp_path / "sub" / "report.html", by="education")
    assert len(_figures(out.read_text(encoding="utf-8"))) == 3


def test_small_groups_show_their_points_and_clipped_cis(con):
    page = render_report(con, "tiny", by="education")
    [_, groups, _] = _figures(page)
    rows = group_table(con, "tiny", "education")
    assert max(r["n"] for r in rows) == 2
    points = [t for t in groups["data"] if t["type"] == "box"]  # one strip of points per group
    assert [len(t["y"]) for t in points] == [r["n"] for r in rows]
    means = _traces(groups, "mean ± 95% CI")[0]
    clipped = [r for r in rows if r["ci_low"] is not None and (r["ci_low"] < 0 or r["ci_high"] > 100)]
    assert clipped  # two agents: Student-t with 1 degree of freedom reaches past [0, 100]
    [marker] = _traces(groups, "CI clipped to the range (hover: true interval)")
    for r in clipped:
        i = [x.startswith(r["group"] + " (") for x in means["x"]].index(True)
        low = means["y"][i] - means["error_y"]["arrayminus"][i]
        high = means["y"][i] + means["error_y"]["array"][i]
        assert 0 <= low <= high <= 100  # drawn within the game's range …
        true = f"95% CI [{r['ci_low']:,.2f}, {r['ci_high']:,.2f}], CI clipped to the range [0.00, 100.00]"
        assert true in means["hovertext"][i]  # … and the true interval in the hover, also of the red marker
        assert any(true in h for h in marker["hovertext"])


def _rounded(page: str) -> str:
    return re.sub(r"\d+\.\d{10,}", lambda m: f"{float(m.group()):.9g}", page)


def test_several_runs_side_by_side(con, db, tmp_path):
    assert runs_named(con, ["sweep-1"]) == ["edu-s2", "tiny"]  # a sweep's id: its runs, as they started
    assert runs_named(con, ["edu-s1", "sweep-1", "edu-s1"]) == ["edu-s1", "edu-s2", "tiny"]
    assert runs_named(con, ["ghost"]) == ["ghost"]  # left for the analysis to name as unknown
    page = render_report(con, RUNS)
    own = _own_markup(page)
    assert "Populace: 2 runs compared" in page and "Figure 1" not in own
    # the runs' parameters (what differs in the table, the rest once), their rounds side by side
    assert "<th class=\"l\">seed</th>" in page and "The same in every run:" in page and "game.ratio=2/3" in page
    for rid in RUNS:
        assert f"<th>{rid}: mean</th>" in page and f'<td class="l">{rid}</td>' in page
        for r in round_table(con, rid):
            assert f"<td>{r['mean']:,.2f}</td>" in page
    [overlaid] = _figures(page)
    assert {t["name"] for t in overlaid["data"]} == set(RUNS)
    assert [a["text"] for a in overlaid["layout"]["annotations"]] == ["mean", "median", "target", "winning number"]
    # one run: its own report (floats to 9 digits: DuckDB's parallel sums may differ in the last bits)
    assert _rounded(render_report(con, ["edu-s1"])) == _rounded(render_report(con, "edu-s1"))
    from populace.cli.main import app

    res = CliRunner().invoke(app, ["report", "sweep-1", "--db", str(db), "--out", str(tmp_path / "s.html")])
    assert res.exit_code == 0, res.output
    assert "2 runs" in res.output and "edu-s2: mean" in (tmp_path / "s.html").read_text(encoding="utf-8")
    res = CliRunner().invoke(app, ["report", "edu-s1", "edu-s2", "--by", "education", "--db", str(db)])
    assert res.exit_code == 2 and "for one run's report" in res.output


def test_a_fork_is_read_beside_its_parent(con):
    side = fork_table(con, "edu-s1-fork")
    assert (side["parent"], side["after_round"], side["measure_kind"]) == ("edu-s1", 1, "numeric")
    parent, mine = round_table(con, "edu-s1"), round_table(con, "edu-s1-fork")
    assert [r["round"] for r in mine] == [2, 3]
    assert [(r["round"], r["shared"]) for r in side["rounds"]] == [(1, True), (2, False), (3, False)]
    assert side["rounds"][0]["fork"]["mean"] == parent[0]["mean"]  # round 1 is the parent's in both
    for r, p, f in zip(side["rounds"][1:], parent[1:], mine, strict=True):
        assert r["difference"] == pytest.approx(f["mean"] - p["mean"])
    assert fork_table(con, "edu-s1") is None  # not a fork
    page = render_report(con, "edu-s1-fork")
    assert "Fork beside its parent" in page and "<th>parent: target</th>" in page
    # per round: each one's mean (numpy here, from the recorded guesses), the difference, each one's target
    means = {(run, r): np.mean([x[1] for x in _valid(con, run, r)]) for run in ("edu-s1", "edu-s1-fork")
             for r in (1, 2, 3) if (run, r) != ("edu-s1-fork", 1)}
    fork = page[page.index('<section id="fork">'):]
    p1 = means["edu-s1", 1]
    assert (f'<tr><td class="l">1</td><td>{p1:.2f}</td><td>(shared)</td><td></td><td>{2 / 3 * p1:.2f}</td>'
            "<td>(shared)</td>") in fork
    for r in (2, 3):
        p, f = means["edu-s1", r], means["edu-s1-fork", r]
        assert (f'<tr><td class="l">{r}</td><td>{p:.2f}</td><td>{f:.2f}</td><td>{f - p:.2f}</td>'
                f"<td>{2 / 3 * p:.2f}</td><td>{2 / 3 * f:.2f}</td></tr>") in fork, r
    assert 'aria-label="The fork and its parent per round"' in page and len(_figures(page)) == 4
    assert "Fork beside its parent" not in render_report(con, "edu-s2")


def test_report_without_population_or_manifest(con):
    page = render_report(con, "plain")
    assert len(_figures(page)) == 2  # histograms and convergence; no groups to plot
    assert "no population profiles" in page and "No manifest" in page


def test_parquet_export_round_trips(con, tmp_path):
    paths = export_parquet(con, RUNS, tmp_path / "pq")
    assert sorted(p.name for p in paths) == sorted(
        f"{t}.parquet" for t in ("runs", "agents", "agent_profiles", "guesses", "rounds", "llm_calls"))
    # every agent of a run with a population has a profile row (NO_PROFILE agents an empty profile)
    expect = {"runs": 2, "agents": 2 * N_AGENTS, "agent_profiles": 2 * N_AGENTS,
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


# --- a database written before simulations were pluggable --------------------------------
# The recorder's schema of that release, verbatim: no runs.simulation / tables_json, no error column.
OLD_SCHEMA = """
CREATE TABLE runs (run_id VARCHAR PRIMARY KEY, started_at TIMESTAMP, finished_at TIMESTAMP, config_json JSON,
    status VARCHAR, reason VARCHAR, hosts VARCHAR[], manifest_json JSON);
CREATE TABLE agents (run_id VARCHAR, agent_id BIGINT, host_id VARCHAR, persona_json JSON);
CREATE TABLE guesses (run_id VARCHAR, round INTEGER, agent_id BIGINT, value DOUBLE, valid BOOLEAN, raw VARCHAR,
    latency_ms DOUBLE);
CREATE TABLE rounds (run_id VARCHAR, round INTEGER, n_valid BIGINT, mean DOUBLE, target DOUBLE,
    winner_agent_id BIGINT, winner_value DOUBLE, n BIGINT, n_winners BIGINT, closed_at TIMESTAMP);
CREATE TABLE llm_calls (run_id VARCHAR, round INTEGER, agent_id BIGINT, replica VARCHAR, prompt_tokens INTEGER,
    completion_tokens INTEGER, latency_ms DOUBLE, attempts INTEGER, valid BOOLEAN, batch_id VARCHAR);
CREATE TABLE agent_profiles (run_id VARCHAR, agent_id BIGINT, persona_index BIGINT, profile JSON, persona JSON);
"""


@pytest.fixture(scope="module")
def old_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("old") / "old.duckdb"
    with duckdb.connect(str(path)) as c:
        c.execute(OLD_SCHEMA)
        cfg = json.dumps({"name": "old", "agents": 4, "rounds": 2, "game": {"ratio": "1/2", "offset": 5}})
        c.execute("INSERT INTO runs VALUES ('old-1', TIMESTAMP '2024-01-01', NULL, ?, 'completed', NULL, ['h'], NULL)",
                  [cfg])
        for r, vals in ((1, [50.0, 30.0, None, 10.0]), (2, [20.0, 14.0, 12.0, 10.0])):
            for a, v in enumerate(vals):
                c.execute("INSERT INTO guesses VALUES ('old-1', ?, ?, ?, ?, ?, 1.0)",
                          [r, a, v, v is not None, "x" if v is None else str(v)])
                c.execute("INSERT INTO agent_profiles VALUES ('old-1', ?, ?, ?, '{}')",
                          [a, a, json.dumps({"occupation": "economist" if a % 2 else "teacher"})])
            good = [v for v in vals if v is not None]
            c.execute("INSERT INTO rounds VALUES ('old-1', ?, ?, ?, ?, 3, ?, 4, 1, NULL)",
                      [r, len(good), sum(good) / len(good), 5 + sum(good) / len(good) / 2, good[-1]])
    return path


def test_a_database_without_tables_json_is_read_as_the_ratio_game(old_db, tmp_path):
    with duckdb.connect(str(old_db), read_only=True) as c:
        info = run_info(c, "old-1")
        assert info["legacy"] and info["simulation"] == "ratio-game" and info["measure"] == "value"
        assert info["equilibrium"] == pytest.approx(10.0)  # 5 + ½·mean converges to 10
        rows = round_table(c, "old-1")
        assert [(r["n"], r["n_valid"]) for r in rows] == [(4, 3), (4, 4)]
        assert rows[0]["mean"] == pytest.approx(30.0) and rows[1]["median"] == pytest.approx(13.0)
        assert rows[0]["summary"]["target"] == pytest.approx(20.0)
        groups = group_table(c, "old-1", "occupation")
        assert [(g["group"], g["n"], g["mean"]) for g in groups] == [
            ("economist", 2, pytest.approx(12.0)), ("teacher", 2, pytest.approx(16.0))]
        page = render_report(c, "old-1")
        assert "Figure 1. Guesses per round" in page and "1 invalid answer(s)" in page
        assert len(_figures(page)) == 3
        paths = export_parquet(c, "old-1", tmp_path / "pq")
        assert {p.name for p in paths} == {"runs.parquet", "agents.parquet", "agent_profiles.parquet",
                                           "llm_calls.parquet", "guesses.parquet", "rounds.parquet"}

