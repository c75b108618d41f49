"""The report in a real browser: `populace report` of the education CoT example opens in headless
Chromium (Playwright) with no console error, no page error and no network request but the file
itself; every figure is drawn, answers hover, the invalid answers page and the reasoning filters
by agent id.

The run is examples/education-cot.yaml (chain of thought, SmolLM2 on llama.cpp) played by
`populace demo`, for one round of its three (`--set rounds=1`) and with 10 of its 50
SmolLM2-written personas, the first two of each education level (`--set population.personas=`
a file of those lines): a fifth of the model time of the 50 (the set-up took 186 s with them in
a profile of the suite). What the report is checked on needs no more: real reasoning to browse
and filter (by agent id, by a word), every education level a group of the mean figure, and
usually some answers the model got wrong (the reasoning table shows at most 50 rows on a page,
so 50 agents did not page it either). How many are invalid is the model's to say, so the paging
of invalid answers is checked exactly on a second run of the same scenario recorded straight
into the file by the recorder's Store (as tests/integration/test_analysis_report.py records its
runs), with 50 agents and 120 invalid answers.

Chromium is the system's (/usr/bin/chromium; `playwright install` would download one from a CDN
this machine cannot reach). Without it the test skips, unless POPULACE_REQUIRE_BROWSER=1 (CI),
where it fails."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest
from populace_ratio_game import RatioGame

from populace.client.prepare import prepare_file
from populace.core.contracts import ConfigRef, OutcomeBatch, RoundResult, RunDone, RunStarted, SpawnBatch
from populace.store.store import Event, Store

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "education-cot.yaml"
AGENTS, ROUNDS = 50, 3  # the invalid answers' run
PLAYED_ROUNDS = 1  # the example's run on SmolLM2
PER_LEVEL = 2  # its personas: the first two of each education level
INVALID_RUN = "edu-cot-invalid"
INVALID_PER_ROUND = 40  # 120 invalid answers: three pages of 50



def populace(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The CLI as a user runs it (`uv run populace …`), else this interpreter's."""
    head = ["uv", "run", "populace"] if shutil.which("uv") else [sys.executable, "-m", "populace.cli"]
    return subprocess.run([*head, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _played_personas(out: Path) -> int:
    """The example's personas file cut to the first PER_LEVEL personas of each education level,
    in the file's order (agent ids follow it); how many that is."""
    kept, seen = [], {}
    for line in (SCENARIO.parent / "personas" / "education-50.jsonl").read_text(encoding="utf-8").splitlines():
        level = json.loads(line)["profile"]["education"]
        if seen.get(level, 0) < PER_LEVEL:
            seen[level] = seen.get(level, 0) + 1
            kept.append(line)
    out.write_text("\n".join(kept) + "\n", encoding="utf-8")
    return len(kept)


def _record_invalid_run(db: Path) -> None:
    """The scenario's run with most answers unreadable, as the recorder receives it."""
    prepared = prepare_file(SCENARIO)
    cfg = prepared.config.model_copy(update={"model": prepared.config.model.model_copy(update={"backend": "dummy"})})
    t0 = datetime(2025, 1, 1, tzinfo=UTC).timestamp()
    ids = list(range(AGENTS))
    events = [Event(f"{INVALID_RUN}.started", "started",
                    RunStarted(run_id=INVALID_RUN, config=cfg, started_at=t0, hosts=["h1"],
                               tables=RatioGame.tables(), manifest=prepared.manifest),
                    blob=prepared.personas),
              Event(f"{INVALID_RUN}.spawn", "spawn", SpawnBatch(run_id=INVALID_RUN, host_id="h1",
                                                                 ranges=[(0, AGENTS)], config_ref=ConfigRef.of(cfg)))]
    for r in range(1, ROUNDS + 1):
        valid = [a >= INVALID_PER_ROUND for a in ids]
        values = [float(10 + a % 7) if ok else None for a, ok in zip(ids, valid)]
        raws = [json.dumps({"reasoning": "Two thirds of two thirds …", "guess": v}) if v is not None
                else f"<b>round {r}, agent {a}: I cannot decide</b>" for a, v in zip(ids, values)]
        events.append(Event(f"{INVALID_RUN}.{r}.outcomes", "outcomes", OutcomeBatch(
            run_id=INVALID_RUN, round=r, host_id="h1", seq=0, agent_ids=ids, columns={"value": values}, valid=valid,
            raws=raws, latency_ms=[5.0] * AGENTS, errors=[None] * AGENTS)))
        good = [v for v in values if v is not None]
        mean = sum(good) / len(good)
        events.append(Event(f"{INVALID_RUN}.{r}.result", "round.result", RoundResult(
            run_id=INVALID_RUN, round=r, n=AGENTS, n_valid=len(good),
            summary={"mean": mean, "target": 2 / 3 * mean, "winner_agent_id": INVALID_PER_ROUND,
                     "winner_value": good[0], "n_winners": 1},
            observation={}, closed_at=t0 + 60 * r)))
    events.append(Event(f"{INVALID_RUN}.done", "done", RunDone(run_id=INVALID_RUN, status="completed", rounds=ROUNDS,
                                                               finished_at=t0 + 600)))
    store = Store(db)
    try:
        store.ingest(events)
    finally:
        store.close()


@pytest.fixture(scope="module")
def reports(tmp_path_factory, chromium, cli):
    """(the education CoT report, the invalid answers' report, the DuckDB file, the agents played),
    written by `populace report` (in this process: what it writes is the point here, not its
    process; tests/e2e/test_cli.py starts the console script)."""
    tmp = tmp_path_factory.mktemp("browser")
    db = tmp / "edu.duckdb"
    personas = tmp / "education-10.jsonl"
    agents = _played_personas(personas)
    res = populace("demo", "--scenario", str(SCENARIO), "--set", f"rounds={PLAYED_ROUNDS}",
                   "--set", f"population.personas={personas}", "--db", str(db), timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    with duckdb.connect(str(db), read_only=True) as con:
        [(run_id,)] = con.execute("SELECT run_id FROM runs").fetchall()
    _record_invalid_run(db)
    out = []
    for rid, name in ((run_id, "r.html"), (INVALID_RUN, "invalid.html")):
        res = cli("report", rid, "--db", str(db), "--out", str(tmp / name))
        assert res.returncode == 0, res.stderr[-3000:]
        out.append(tmp / name)
    return (*out, db, agents)



def _open(browser, path: Path):
    """The page, loaded and drawn, with what it asked of the network and what it complained of."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    requests, errors = [], []

    def record(route):
        requests.append(route.request.url)
        route.continue_()

    page.route("**/*", record)
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    # plotly.js marks a div it has drawn into
    page.wait_for_function("document.querySelectorAll('.plot:not(.js-plotly-plot)').length === 0")
    return page, requests, errors


def _hover_shows_a_label(page, plot: str, mark: str, wanted: str = "") -> str:
    """Move the mouse onto the visible `mark`s (bars, points) of a figure, one after another,
    until the hover label names `wanted`; that label's text (the last one seen otherwise)."""
    page.locator(f"#{plot}").scroll_into_view_if_needed()
    boxes = [b for b in (m.bounding_box() for m in page.locator(f"#{plot} {mark}").all())
             if b and b["width"] > 1 and b["height"] > 1]
    assert boxes, f"{plot}: no {mark} drawn"
    text = ""
    for box in boxes[:60]:
        page.mouse.move(0, 0)
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        label = page.locator(f"#{plot} .hoverlayer .hovertext").first
        label.wait_for(state="visible", timeout=5000)
        text = label.text_content()
        if wanted in text:
            break
    return text


def test_the_education_cot_report_in_a_browser(reports, browser):
    report, _, db, agents = reports
    with duckdb.connect(str(db), read_only=True) as con:
        run_id = con.execute("SELECT run_id FROM runs WHERE run_id <> ?", [INVALID_RUN]).fetchone()[0]
        n_valid, n_invalid = con.execute("SELECT count(*) FILTER (WHERE valid), count(*) FILTER (WHERE NOT valid) "
                                         "FROM guesses WHERE run_id = ?", [run_id]).fetchone()
        agent, raw = con.execute("SELECT agent_id, raw FROM guesses WHERE run_id = ? AND valid "
                                       "ORDER BY agent_id DESC LIMIT 1", [run_id]).fetchone()
        phd = con.execute("SELECT count(*) FROM guesses g JOIN agent_profiles p USING (run_id, agent_id) "
                          "WHERE run_id = ? AND g.valid AND p.profile->>'education' = 'Ph.D.'", [run_id]).fetchone()[0]
    assert agents == 5 * PER_LEVEL
    assert n_valid + n_invalid == agents * PLAYED_ROUNDS and n_valid > 0
    page, requests, errors = _open(browser, report)
    assert errors == []
    assert requests == [report.as_uri()]  # the file itself and nothing else: no CDN, font or MathJax
    assert page.locator("script[src], link[href]").count() == 0
    # every figure is drawn: an svg with its traces in each plot div
    plots = page.locator(".plot")
    ids = [plots.nth(i).get_attribute("id") for i in range(plots.count())]
    # distributions per round, mean per education level (and age …), convergence, and the run's round 1
    # beside Nagel's (1995) people (the ratio game ships their first period; issue 37)
    assert len(ids) == 4
    for plot in ids:
        assert page.locator(f"#{plot} svg.main-svg").count() >= 1, plot
        assert page.locator(f"#{plot} .trace").count() > 0, plot
    # the mouse on a histogram bar names its bin and count; on a group's mean, its n and true CI
    assert "agents" in _hover_shows_a_label(page, ids[0], ".bars .point path")
    # (a group's points are agents; its diamond is the mean)
    group_label = _hover_shows_a_label(page, ids[1], ".scatterlayer .points path.point", wanted="95% CI")
    assert "95% CI" in group_label and "n = " in group_label
    # the equilibrium (0) is drawn in every histogram and in the convergence figure
    assert page.locator(f"#{ids[0]}").get_attribute("data-figure").count("equilibrium 0") >= PLAYED_ROUNDS
    # the model's invalid answers, counted; each valid answer's reasoning, filterable by agent id
    assert page.get_by_text(f"{n_invalid} invalid answer(s) in this run").is_visible()
    assert page.locator("#invalid-answers tbody tr").count() == n_invalid
    reasoning = page.locator("#reasoning")
    assert reasoning.locator("tbody tr").count() == n_valid
    assert reasoning.locator("tbody tr:visible").count() == min(n_valid, 50)
    reasoning.locator("input[type=search]").fill(str(agent))
    visible = reasoning.locator("tbody tr:visible")
    assert visible.count() == PLAYED_ROUNDS and visible.first.get_attribute("data-agent") == str(agent)
    assert "education:" in visible.first.text_content()
    try:
        thought = json.loads(raw).get("reasoning")
    except (ValueError, AttributeError):
        thought = None
    if isinstance(thought, str) and thought.strip():  # the model's own words are there to read
        assert " ".join(thought.split())[:30] in " ".join(visible.first.text_content().split())
    reasoning.locator("input[type=search]").fill("ph.d.")  # words: every valid row of a Ph.D. agent
    assert reasoning.locator("tbody tr:visible").count() == phd
    page.close()


def test_invalid_answers_are_all_there_and_paged(reports, browser):
    _, report, _, _ = reports
    page, requests, errors = _open(browser, report)
    assert errors == [] and requests == [report.as_uri()]
    total = INVALID_PER_ROUND * ROUNDS
    assert page.get_by_text(f"{total} invalid answer(s) in this run").is_visible()
    table = page.locator("#invalid-answers")
    label = table.locator(".page-label")
    assert table.locator("tbody tr").count() == total  # every one of them, not five
    assert label.text_content() == f"page 1 of 3 ({total} of {total} rows)"
    assert table.locator("tbody tr:visible").count() == 50
    assert table.locator("button.prev").is_disabled()
    table.locator("button.next").click()
    table.locator("button.next").click()
    assert label.text_content().startswith("page 3 of 3")
    assert table.locator("button.next").is_disabled()
    last = table.locator("tbody tr:visible")
    assert last.count() == total - 100
    # the raw text as the model wrote it, shown as text (its markup escaped, not rendered)
    assert last.last.locator(".raw").text_content() == f"<b>round {ROUNDS}, agent {INVALID_PER_ROUND - 1}: " \
                                                       "I cannot decide</b>"
    table.locator("input[type=search]").fill("7")  # an agent id: that agent's invalid answers, one per round
    assert table.locator("tbody tr:visible").count() == ROUNDS and label.text_content().startswith("page 1 of 1")
    # the valid answers' reasoning is read from the CoT JSON
    assert "Two thirds of two thirds" in page.locator("#reasoning tbody tr").first.text_content()
    page.close()
