"""The reports of a feed run and of a Schelling run in a real browser: each opens in headless
Chromium (Playwright) with no console or page error and no request but the file itself, and every
figure is drawn — the feed's activity, stance per group and follow graph, Schelling's activity,
grid pictures (one heatmap per round) and like-neighbour share.

Both runs are small and played locally (dummy model) into one DuckDB file, as `populace run
--local` records them; the reports are written by `write_report`, as `populace report` writes
them (the CLI's report is tested in test_report_browser.py and test_client_api.py)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from populace.analysis import write_report
from populace.client import simulate

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SCHELLING_ROUNDS = 3


@pytest.fixture(scope="module")
def reports(tmp_path_factory, chromium):
    """{"feed": report path, "schelling": report path}."""
    tmp = tmp_path_factory.mktemp("shapes-browser")
    db = str(tmp / "shapes.duckdb")
    runs = {
        "feed": simulate(str(ROOT / "examples" / "feed.yaml"), local=True, db=db, agents=150, rounds=3,
                         pool={"size": 200, "seed_posts": 60},
                         model={"backend": "dummy", "latency_s": 0.0, "seed": 1}).run_id,
        "schelling": simulate(str(ROOT / "examples" / "schelling.yaml"), local=True, db=db, agents=200,
                              rounds=SCHELLING_ROUNDS, grid={"width": 16, "height": 16, "torus": True,
                                                             "kinds": 2}).run_id,
    }
    with duckdb.connect(db, read_only=True) as con:
        return {name: write_report(con, run_id, tmp / f"{name}.html") for name, run_id in runs.items()}


def _open(browser, path: Path):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(120_000)  # a deadline for a loaded machine (a 5 MB page), not a measurement
    requests, errors = [], []

    def record(route):
        requests.append(route.request.url)
        route.continue_()

    page.route("**/*", record)
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    page.wait_for_function("document.querySelectorAll('.plot:not(.js-plotly-plot)').length === 0")
    return page, requests, errors


def _every_figure_drawn(page) -> list[str]:
    plots = page.locator(".plot")
    ids = [plots.nth(i).get_attribute("id") for i in range(plots.count())]
    for plot in ids:
        assert page.locator(f"#{plot} svg.main-svg").count() >= 1, plot
        assert page.locator(f"#{plot} .trace").count() > 0, plot
    return ids


def _figures_of(page, anchor: str) -> list[str]:
    return [p.get_attribute("id") for p in page.locator(f"#{anchor} .plot").all()]


def test_the_feed_and_schelling_reports_draw_every_figure(reports, browser):
    page, requests, errors = _open(browser, reports["feed"])
    assert errors == [] and requests == [reports["feed"].as_uri()]
    _every_figure_drawn(page)
    for anchor in ("activity", "distribution", "graph"):
        assert len(_figures_of(page, anchor)) == 1, anchor
    [graph] = _figures_of(page, "graph")
    assert page.locator(f"#{graph} .scatterlayer .trace").count() >= 2  # in- and out-degree, per round
    assert page.get_by_text("kind follow").first.is_visible()
    page.close()

    page, requests, errors = _open(browser, reports["schelling"])
    assert errors == [] and requests == [reports["schelling"].as_uri()]
    _every_figure_drawn(page)
    pictures, like = _figures_of(page, "grid")
    # one heatmap drawn per round (plotly paints each as an image in its subplot)
    assert page.locator(f"#{pictures} .hm image").count() == SCHELLING_ROUNDS
    assert page.locator(f"#{like} .scatterlayer .trace").count() == 1
    assert page.locator("#grid tbody tr").count() == SCHELLING_ROUNDS
    page.close()
