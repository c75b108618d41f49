"""The run page's agents table, distribution and fork form in a real browser: a stack (one
agent-host, the recorder, in one process) and the manager's app served as `populace manager`
serves it (uvicorn on a free port of 127.0.0.1, in the test's process: the `managers` fixture),
driven by headless Chromium (Playwright). A ratio-game run of the 50 personas of
examples/personas/education-50.jsonl plays slowed rounds; its page, opened as it starts:
- draws the last closed round's histogram, and draws it again for the next round without a
  reload (the page asks the recorder once per round close);
- shows the agents table (profile, persona, each round's value and raw answer), 25 a page:
  next and previous, a search by words of the persona/profile (any case) and by an agent id;
- shows every number of the round summary in the rounds table;
- shows where each round went (table round_profile, asked of the recorder): the host's row and
  the environment's, and in words what took most of the time;
- forks: a round not completed is refused beside the field in `populace fork`'s words, a valid
  fork goes to the fork's page.
A screenshot of the page with its agents table is saved to the test's tmp dir (printed).

Chromium is the system's (/usr/bin/chromium); without it the test skips, unless
POPULACE_REQUIRE_BROWSER=1 (CI). Every process is ended by its PID."""

from __future__ import annotations

import asyncio
import os
import re
import threading
from pathlib import Path

import pytest

from populace.client.prepare import prepare
from populace.client.run import play
from populace.core import bus
from populace.core.contracts import RunConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 5
# 50 agents, 5 at a time, 0.5 s each: rounds of ~5 s, so the page sees them close one by one (it
# needs two; the table, search and profile read the recorder, live or not; the fork comes after)
CONFIG = {"rounds": ROUNDS, "seed": 4, "population": {"personas": "personas/education-50.jsonl"},
          "model": {"latency_s": 0.5, "seed": 6}}
SLOW = {"POPULACE_MAX_IN_FLIGHT": "5", "POPULACE_OUTCOME_BATCH_SIZE": "5"}


@pytest.fixture(scope="module")
def site(tmp_path_factory, chromium, stacks, managers):
    """(manager URL, stack URL, tmp dir)."""
    tmp = tmp_path_factory.mktemp("run-page")
    (tmp / "logs").mkdir()
    # the services share one process, the manager is served in this one: the page reads through
    # the manager and the bus
    stack = stacks(hosts=1, db=str(tmp / "populace.duckdb"), log_dir=str(tmp / "logs"),
                   env={"POPULACE_STORAGE": "memory", **SLOW}, one_process=True, timeout=180)
    print(f"\nscreenshots: {tmp}")
    return managers(stack.url), stack.url, tmp


def start_run(url: str, rid: str) -> threading.Thread:
    prepared = prepare(RunConfig.model_validate(CONFIG), base=ROOT / "examples")

    def run() -> None:
        async def go():
            nc = await bus.connect(url, "run-page-browser")
            try:
                await play(nc, prepared.config, run_id=rid, personas=prepared.personas, manifest=prepared.manifest,
                           stall_s=120)
            finally:
                await nc.close()

        asyncio.run(go())

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# the distribution's rounds as the page drew them, recorded by the page itself (no reload between)
WATCH = """
window.__dist = [];
document.addEventListener("DOMContentLoaded", () => {
  const d = document.getElementById("dist");
  new MutationObserver(() => { if (d.dataset.round) window.__dist.push(d.dataset.round); })
    .observe(d, {attributes: true, attributeFilter: ["data-round"]});
});
"""


def test_agents_table_distribution_and_fork_on_the_run_page(site, browser):
    base, url, tmp = site
    rid = f"page-{os.getpid()}"
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    page.add_init_script(WATCH)
    player = start_run(url, rid)
    page.goto(f"{base}/runs/{rid}")

    # the last closed round's histogram, drawn again as the next round closes
    page.wait_for_function("() => Number(document.getElementById('dist').dataset.round) >= 1", timeout=120_000)
    first = int(page.get_attribute("#dist", "data-round"))
    assert page.locator("#dist rect.bin").count() >= 1
    page.wait_for_function(f"() => Number(document.getElementById('dist').dataset.round) > {first}",
                           timeout=60_000)
    drawn = [int(r) for r in page.evaluate("window.__dist")]
    assert drawn == sorted(drawn) and len(set(drawn)) >= 2  # no reload in between
    assert page.locator("#dist-caption").inner_text().startswith(f"(round {drawn[-1]}, 50 valid")

    # where each round went (round_profile, asked of the recorder as each round closes): the host's
    # row, the environment's and the recorder's per closed round, the model's wait the largest
    page.wait_for_function("() => document.querySelectorAll('#profile-table tbody tr[data-role=host]').length >= 1",
                           timeout=30_000)
    assert page.locator("#profile-table tbody tr[data-role=environment]").count() >= 1
    host_row = page.locator("#profile-table tbody tr[data-role=host]").first.locator("td")
    assert host_row.nth(1).inner_text() == "host-0@0" and host_row.nth(2).inner_text() == "50"
    assert page.locator("#profile-note").inner_text().startswith("Most of the time: ")

    # the agents table: 25 a page, profile, persona, each round's value and raw answer
    page.wait_for_function("() => document.getElementById('agents-table').dataset.total === '50'", timeout=30_000)
    rows = page.locator("#agents-table tbody tr")
    assert rows.count() == 25 and page.locator("#agents-info").inner_text() == "agents 1–25 of 50"
    row0 = rows.nth(0)
    assert row0.get_attribute("data-agent") == "0"
    assert "education:" in row0.locator("td").nth(1).inner_text()
    assert row0.locator("td").nth(2).inner_text().strip()  # the persona
    answer = row0.locator("td.answer").first
    assert answer.locator(".values").inner_text().strip() and answer.locator(".raw").inner_text().strip()
    page.click("#agents-next")
    page.wait_for_function("() => document.getElementById('agents-info').textContent === 'agents 26–50 of 50'")
    assert rows.nth(0).get_attribute("data-agent") == "25" and page.is_disabled("#agents-next")
    page.click("#agents-prev")
    page.wait_for_function("() => document.getElementById('agents-info').textContent === 'agents 1–25 of 50'")

    page.fill("#agent-q", "BACHELOR'S")  # 10 of the 50 personas; any case
    page.click("#agent-go")
    page.wait_for_function("() => document.getElementById('agents-table').dataset.total === '10'")
    texts = [rows.nth(i).locator("td").nth(1).inner_text() for i in range(rows.count())]
    assert len(texts) == 10 and all("bachelor's" in t for t in texts)
    page.screenshot(path=str(tmp / "run-page-agents.png"), full_page=True)
    page.fill("#agent-q", "42")
    page.click("#agent-go")
    page.wait_for_function("() => document.getElementById('agents-table').dataset.total === '1'")
    assert rows.count() == 1 and rows.nth(0).get_attribute("data-agent") == "42"

    # the round summary's every number, one column each
    heads = page.locator("#results thead th").all_inner_texts()
    for col in ("mean", "target", "winner agent id", "winner value", "n winners"):
        assert col in heads

    # fork: refused beside the field in the CLI's words, then one that goes
    player.join(180)
    page.reload()
    page.wait_for_function("() => !document.getElementById('fork-card').hidden", timeout=30_000)
    page.fill("#after-round", "9")
    page.fill("#changes", "rounds=8")
    page.click("#fork")
    error = page.locator('.field-error[data-field="after_round"]')
    assert error.inner_text() == f"--from-round: run {rid} has completed {ROUNDS} round(s); fork from 1..{ROUNDS}"
    assert page.input_value("#changes") == "rounds=8"  # what was typed is kept
    page.fill("#after-round", "3")
    page.fill("#changes", "rounds=4\ngame.ratio=1/2")
    page.click("#fork")
    page.wait_for_url(re.compile(r"/runs/(?!" + re.escape(rid) + r")[^/?]+\?msg="), timeout=30_000)
    assert f"of {rid} after round 3 submitted" in page.locator("#flash-msg").inner_text()
    page.close()
