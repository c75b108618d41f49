"""An interview from a run's page in a real browser: a stack (2 agent-hosts, the recorder),
the manager's app on a free port (served in the test's process: the `managers` fixture), headless
Chromium. A recorded vote run's page asks its agents
a question after round 2: a bad question is refused beside the field it names (nothing is
asked); a good one is placed, answered by the agent-hosts from the checkpoint, and drawn as
bars per education group, with no console error. Every process is ended by its PID."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

import duckdb
import pytest
from example_copies import example_copy

from populace.client.prepare import prepare_file
from populace.client.run import play
from populace.core import bus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory, chromium, stacks, managers):
    tmp = tmp_path_factory.mktemp("interview-page")
    (tmp / "logs").mkdir()
    # the services share one process (two agent-hosts in it), the manager is served in this one:
    # the page asks through the manager and the bus, and no test here kills or measures a service
    stack = stacks(hosts=2, db=str(tmp / "populace.duckdb"), log_dir=str(tmp / "logs"),
                   env={"POPULACE_STORAGE": "memory"}, one_process=True, timeout=180)
    return managers(stack.url), stack, tmp


def test_an_interview_from_the_run_page(site, browser):
    base, stack, tmp = site
    prepared = prepare_file(example_copy(tmp, "vote.yaml", agents=50, model={"latency_s": 0.0, "seed": 2}))

    async def run():
        nc = await bus.connect(stack.url, "e2e-interview-page")
        try:
            return await play(nc, prepared.config, personas=prepared.personas, manifest=prepared.manifest,
                              stall_s=120)
        finally:
            await nc.close()

    box: dict = {}  # played in a thread of its own: Playwright's sync API holds this thread's event loop
    worker = threading.Thread(target=lambda: box.update(out=asyncio.run(run())))
    worker.start()
    worker.join()
    out = box["out"]
    assert out.status == "completed", out.reason
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    failed: list[tuple[int, str]] = []
    page.on("response", lambda r: failed.append((r.status, r.url)) if r.status >= 400 else None)
    page.goto(f"{base}/runs/{out.run_id}")
    card = page.locator("#interview-card")
    assert card.is_visible()
    # a Likert scale of one point: refused beside its field, what was typed kept, nothing asked
    page.fill("#iv-after", "2")
    page.fill("#iv-question", "How much do you trust the council?")
    page.select_option("#iv-kind", "likert")
    page.fill("#iv-points", "1")
    page.click("#interview-ask")
    error = page.locator('.field-error[data-field="points"]')
    assert "points: a Likert scale needs 2 to 11 points, not 1" in error.text_content()
    assert page.input_value("#iv-question") == "How much do you trust the council?"
    # a question with options, charted by education
    page.select_option("#iv-kind", "options")
    page.fill("#iv-points", "")
    page.fill("#iv-options", "yes, no, not sure")
    page.fill("#iv-by", "education")
    page.click("#interview-ask")
    assert "interview iv-" in page.locator("#flash-msg").text_content()
    page.wait_for_function("document.getElementById('interview-card').dataset.status === 'recorded'", timeout=60_000)
    chart = page.locator("#interview-charts svg.interview-chart")
    assert chart.count() == 1 and int(chart.get_attribute("data-bars")) > 0
    groups = {page.locator("#interview-charts rect.iv-bar").nth(i).get_attribute("data-group")
              for i in range(page.locator("#interview-charts rect.iv-bar").count())}
    assert groups == {"elementary school", "high school", "bachelor's", "master's", "Ph.D."}
    # the refused form's answer (422) is the page's only failed request (the console also names the
    # browser's own favicon request, which the manager does not serve)
    assert failed == [(422, f"{base}/runs/{out.run_id}/interview")], failed
    assert [e for e in errors if "Failed to load resource" not in e] == []
    page.screenshot(path=str(tmp / "interview.png"), full_page=True)
    chart.screenshot(path=str(tmp / "interview-chart.png"))
    print(f"\nscreenshots: {tmp}")
    page.close()
    # recorded: 50 answers of one request, after round 2
    with contextlib.suppress(duckdb.IOException), duckdb.connect(stack.db, read_only=True) as con:
        assert con.execute("SELECT count(*), count(DISTINCT request), min(after_round) FROM interviews "
                           "WHERE run_id = ?", [out.run_id]).fetchone() == (50, 1, 2)
