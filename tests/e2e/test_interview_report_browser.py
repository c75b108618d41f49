"""The report's interview figures in a real browser: `populace report` of a vote run with a
planned panel and an exit survey, beside a (synthetic) reference, opens in headless Chromium
with no console error, no page error and no request but the file itself; every figure is drawn
(questions per group, panels over rounds, simulated beside reference) and the free-text answers
filter by agent id and by words.

The run is the vote example with interviews, played in one process and recorded by the
recorder's own Store (tests/integration/recorded_locally.py): the rows the fleet records."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from example_copies import example_copy
from recorded_locally import play, record

from populace.cli.main import app
from populace.client.prepare import prepare_file

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "tests" / "fixtures" / "reference-turnout-synthetic.csv"
PANEL = [
    {"id": "panel", "after": "every", "questions": [
        {"id": "trust", "text": "How much do you trust the other voters?", "labels": ["none", "some", "a lot"]},
        {"id": "turnout", "text": "Will you vote in the next election?", "options": ["yes", "no", "maybe"]}]},
    {"id": "exit", "after": [3], "questions": [
        {"id": "sure", "text": "How sure are you of your vote, from 0 to 100?", "min": 0, "max": 100},
        {"id": "why", "text": "Why did you vote as you did?", "max_chars": 120}]},
]


@pytest.fixture(scope="module")
def report(tmp_path_factory, chromium):
    tmp = tmp_path_factory.mktemp("interview-browser")
    db = tmp / "populace.duckdb"
    prepared = prepare_file(example_copy(tmp, "vote.yaml", agents=60, interviews=PANEL))
    record(db, prepared, play(prepared), "vote-panel")
    out = tmp / "report.html"
    # the CLI in this process: a fresh import of it costs tens of seconds on a loaded machine
    res = CliRunner().invoke(app, ["report", "vote-panel", "--db", str(db), "--out", str(out), "--by", "education",
                                   "--reference", str(REFERENCE)])
    assert res.exit_code == 0, (res.output + repr(res.exception))[-3000:]
    return out


def test_the_interview_figures_render_without_errors(report, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    requests, errors = [], []

    def seen(route):
        requests.append(route.request.url)
        route.continue_()

    page.route("**/*", seen)
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(report.as_uri())
    page.wait_for_load_state("load")
    page.wait_for_function("document.querySelectorAll('.plot:not(.js-plotly-plot)').length === 0")
    assert errors == [] and requests == [report.as_uri()]
    for anchor, figures in (("interview-1", 2), ("interview-2", 1), ("interview-3", 1), ("panels", 2),
                            ("reference", 2)):
        section = page.locator(f"section#{anchor}")
        assert section.count() == 1, anchor
        plots = section.locator(".plot")
        assert plots.count() == figures, anchor
        for i in range(figures):
            assert plots.nth(i).locator("svg.main-svg").count() >= 1, anchor
            assert plots.nth(i).locator(".trace").count() > 0, anchor
    assert "SYNTHETIC" in page.locator("section#reference").text_content()
    answers = page.locator("#interview-answer-rows")
    assert answers.locator("tbody tr").count() == 60  # the exit survey's free text, one per agent
    answers.locator("input[type=search]").fill("7")
    visible = answers.locator("tbody tr:visible")
    assert visible.count() == 1 and visible.first.get_attribute("data-agent") == "7"
    assert "education:" in visible.first.text_content()
    answers.locator("input[type=search]").fill("ph.d.")
    assert answers.locator("tbody tr:visible").count() == 12
    page.close()
