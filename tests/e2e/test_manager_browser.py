"""The manager in a real browser: a stack without agent-hosts, two `populace node` daemons (A
and B) and `populace manager` (uvicorn, a free port on 127.0.0.1), all on 127.0.0.1, driven by
headless Chromium (Playwright). From the pages: both nodes are listed; two agent-hosts are
deployed on node A by one request (the form's count 2), the only hosts the runs have; a
simulated vLLM replica is deployed on node B, and the Replicas page finds it healthy; a bad
scenario shows the CLI's message under its field (YAML, and the parameter form); a ratio-game
run of 2,000 agents × 3 rounds on the dummy model starts from the form and its page's answers
counter and chart grow without a reload; a second run is cancelled mid-round and shows as
cancelled, resumed, and cancelled again; an agent-host's log is tailed; one agent-host is
stopped from its row; node A is cleaned up, and psutil confirms its children are gone while
node B's replica (and its server) still runs.

Screenshots go to the test's tmp dir (printed). With POPULACE_SCREENSHOT_DIR=DIR the finished
run's page is also saved as DIR/manager-run.png (the README's docs/img/manager-run.png).

The rounds are slowed so the live counter has something to show: each agent-host plays at
most 100 agents at a time (POPULACE_MAX_IN_FLIGHT, and the node form's field) and reports
them in outcome batches of 100 (a progress tick each); each batch of answers takes `latency_s`.

Chromium is the system's (/usr/bin/chromium); without it the test skips, unless
POPULACE_REQUIRE_BROWSER=1 (CI), where it fails. Every process is ended by its PID."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest

from populace.core import bus, subjects
from populace.core.contracts import HostInfo
from populace.core.natsserver import free_port
from populace.core.processes import terminate

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

IN_FLIGHT = 100
# hosts tick progress once per outcome batch: batches of 100 make the counter move every wave
SLOW = {"POPULACE_MAX_IN_FLIGHT": str(IN_FLIGHT), "POPULACE_OUTCOME_BATCH_SIZE": str(IN_FLIGHT)}



def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _tree(pid: int) -> list[int]:
    """The PIDs of a process's children and theirs."""
    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


def _until(check, timeout: float, what: str, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(every)


def _reload_until(page, selector: str, timeout: float, what: str) -> None:
    """Reload the page until `selector` is on it (pages read KV when they load)."""
    def found() -> bool:
        page.reload()
        return page.locator(selector).count() >= 1

    _until(found, timeout, what, every=1.0)


def _hosts(url: str) -> list[HostInfo]:
    async def read():
        nc = await bus.connect(url, "manager-browser-test")
        try:
            return await bus.registry_entries(nc.jetstream(), subjects.HOSTS_BUCKET, HostInfo, fresh_within_s=10)
        finally:
            await nc.close()

    # Playwright's sync API runs an event loop in this thread: read KV from another one
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, read()).result()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, chromium, stacks):
    """(manager URL, [(node id, node daemon process)] of nodes A and B, stack URL, screenshot dir)."""
    tmp = tmp_path_factory.mktemp("manager")
    shots = tmp / "screenshots"
    shots.mkdir()
    # no agent-host of its own: the runs play on the two that node A is asked for (their own
    # processes, which the test stops and counts); the core services share one process
    stack = stacks(hosts=0, db=str(tmp / "populace.duckdb"), log_dir=str(tmp / "logs"),
                   env={"POPULACE_STORAGE": "memory"}, one_process=True, timeout=180)
    procs: list[subprocess.Popen] = []
    try:
        env = {**os.environ, "POPULACE_HEARTBEAT_S": "0.5", **SLOW}  # the node's children inherit SLOW
        env.pop("POPULACE_PARENT_PID", None)
        nodes = []
        for name in ("a", "b"):
            node_id = f"{name}-{uuid.uuid4().hex[:6]}"
            with open(tmp / "logs" / f"node-{name}.log", "ab") as log:
                node = subprocess.Popen([sys.executable, "-m", "populace.cli", "node", "--nats", stack.url,
                                         "--node-id", node_id, "--log-dir", str(tmp / f"node-{name}"),
                                         "--stop-grace", "5"], env=env, stdout=log, stderr=log, start_new_session=True)
            procs.append(node)
            nodes.append((node_id, node))
        port = free_port()
        with open(tmp / "logs" / "manager.log", "ab") as log:
            manager = subprocess.Popen([sys.executable, "-m", "populace.cli", "manager", "--nats", stack.url,
                                        "--port", str(port)], env=env, stdout=log, stderr=log,
                                       start_new_session=True)
        procs.append(manager)
        base = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            assert manager.poll() is None, (tmp / "logs" / "manager.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=2) as res:
                    return res.status == 200
            except OSError:
                return False

        _until(healthy, 60, "the manager answers /healthz")
        print(f"\nscreenshots: {shots}")
        yield base, nodes, stack.url, shots
    finally:
        for p in reversed(procs):
            terminate(p)



# Every value the answers counter shows, recorded by the page itself (no reload in between).
WATCH_ANSWERS = """
window.__answers = [];
window.__points = [];
document.addEventListener("DOMContentLoaded", () => {
  const a = document.getElementById("answered"), c = document.getElementById("chart");
  if (!a) return;
  new MutationObserver(() => window.__answers.push(a.textContent)).observe(a, {childList: true, characterData: true, subtree: true});
  new MutationObserver(() => window.__points.push(c.dataset.points)).observe(c, {attributes: true, attributeFilter: ["data-points"]});
});
"""


def _start_run(page, base: str, text: str) -> str:
    page.goto(base + "/start")
    page.select_option("#simulation", "ratio-game")
    page.fill("#scenario", text)
    page.click("#submit")
    page.wait_for_url("**/runs/*")
    return page.url.split("/runs/")[1].split("?")[0]


def test_deploy_run_watch_cancel_and_clean_up_from_the_browser(fleet, browser):
    base, [(node_id, node), (other_id, other)], stack_url, shots = fleet
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("dialog", lambda d: d.accept())  # the clean-up's confirm()
    page.add_init_script(WATCH_ANSWERS)

    # both nodes are listed; two agent-hosts are deployed on node A by one request from its form
    page.goto(base + "/nodes")
    _reload_until(page, f"#node-{node_id}", 30, "node A on the page")
    _reload_until(page, f"#node-{other_id}", 30, "node B on the page")
    section = page.locator(f"#node-{node_id}")
    section.locator("form.start select[name=kind]").select_option("agent-host")
    section.locator("form.start input[name=count]").fill("2")
    section.locator("form.start input[name=max_in_flight]").fill(str(IN_FLIGHT))
    section.locator("form.start button").click()
    page.wait_for_url("**/nodes?msg=*")
    assert f"node {node_id} started agent-host-1, agent-host-2" in page.locator("#flash-msg").text_content()
    for proc in ("agent-host-1", "agent-host-2"):
        assert page.locator(f"#node-{node_id} tr[data-proc={proc}]").get_attribute("data-state") == "running"
    assert page.locator(f"#node-{other_id} tr[data-proc]").count() == 0
    host_ids = {f"{node_id}-agent-host-1", f"{node_id}-agent-host-2"}
    _until(lambda: host_ids <= {h.host_id for h in _hosts(stack_url)}, 60,
           "node A's two agent-hosts registered in KV hosts")
    # and a simulated vLLM replica on node B: it registers, and the Replicas page finds it healthy
    section = page.locator(f"#node-{other_id}")
    section.locator("form.start select[name=kind]").select_option("replicas")
    section.locator("form.start select[name=backend]").select_option("sim")
    section.locator("form.start button").click()
    page.wait_for_url("**/nodes?msg=*")
    assert f"node {other_id} started replicas-1" in page.locator("#flash-msg").text_content()
    page.screenshot(path=str(shots / "nodes.png"), full_page=True)
    page.goto(base + "/replicas")
    _reload_until(page, "tr[data-replica][data-healthy=yes]", 60, "the node's sim replica healthy on the Replicas page")
    assert page.locator("tr[data-replica] td.hit-rate").count() >= 1
    # live without a reload: the stream's probes refresh the heartbeat age in place
    page.wait_for_function("() => document.getElementById('live').textContent === 'live'", timeout=30_000)
    page.evaluate("document.querySelector('tr[data-replica] td.heartbeat').textContent = 'stale'")
    page.wait_for_function("() => document.querySelector('tr[data-replica] td.heartbeat').textContent.endsWith('s ago')",
                           timeout=30_000)
    page.screenshot(path=str(shots / "replicas.png"), full_page=True)

    # a bad scenario: the CLI's message under the field it names; nothing starts
    page.goto(base + "/start")
    page.fill("#scenario", "agents: 0\nrounds: 3\nmodel: {backend: dummy}\n")
    page.click("#submit")
    err = page.locator('#errors li[data-field="agents"]')
    assert "agents: Input should be greater than or equal to 1" in err.text_content()
    assert "/start" in page.url
    page.screenshot(path=str(shots / "start-error.png"), full_page=True)
    # the same from the parameter form rendered from the simulation's schema: next to the input
    page.click("#to-params")
    page.fill("input[name='p.agents']", "0")
    page.click("#submit")
    cell = page.locator('td.field-error[data-field="agents"]')
    assert cell.text_content().startswith("agents: Input should be greater than or equal to 1")
    page.screenshot(path=str(shots / "params-error.png"), full_page=True)

    # run 1: 2,000 agents × 3 rounds; the page counts answers and charts rounds as they close
    rid = _start_run(page, base, "name: manager-browser\nagents: 2000\nrounds: 3\nseed: 1\n"
                                 "model: {backend: dummy, latency_s: 0.5}\n")
    assert page.locator("#live").text_content() in ("connecting…", "live")
    page.wait_for_function("() => window.__answers.some(t => /^[≥ ]*[1-9]/.test(t))", timeout=120_000)
    page.screenshot(path=str(shots / "run-live.png"), full_page=True)
    # the dummy model needs no replica: the run page's replicas line says so (asked of /replicas.json)
    page.wait_for_function("() => document.getElementById('replicas-line').dataset.replicas === '0'", timeout=30_000)
    page.wait_for_function("() => document.getElementById('chart').dataset.points === '3'", timeout=180_000)
    page.wait_for_function("() => document.getElementById('status').textContent === 'done'", timeout=60_000)
    points = page.evaluate("window.__points")
    assert "1" in points and "2" in points and points[-1] == "3", points  # grew point by point, no reload
    assert page.locator("#chart circle.pt").count() == 6  # mean and target per round
    assert page.locator("#results tbody tr").count() == 3
    answers = page.evaluate("window.__answers")
    assert any(t.replace(",", "").lstrip("≥ ").isdigit() and 0 < int(t.replace(",", "").lstrip("≥ ")) <= 2000
               for t in answers), answers
    assert page.locator("#cancel-form").is_hidden()
    page.screenshot(path=str(shots / "run-done.png"), full_page=True)
    if os.environ.get("POPULACE_SCREENSHOT_DIR"):  # the README's picture of the run page
        readme_dir = Path(os.environ["POPULACE_SCREENSHOT_DIR"])
        readme_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shots / "run-done.png", readme_dir / "manager-run.png")
        print(f"run page saved as {readme_dir / 'manager-run.png'}")

    # run 2: cancelled mid-round from its page
    rid2 = _start_run(page, base, "name: manager-cancel\nagents: 2000\nrounds: 3\n"
                                  "model: {backend: dummy, latency_s: 2.0}\n")
    page.wait_for_function("() => document.getElementById('current-round').textContent === '1' && "
                           "window.__answers.some(t => /^[≥ ]*[1-9]/.test(t))", timeout=120_000)
    page.click("#cancel")
    page.wait_for_url(f"**/runs/{rid2}?msg=*")
    page.wait_for_function("() => document.getElementById('status').textContent === 'cancelled'", timeout=60_000)
    assert page.locator("#resume-form").is_visible()
    page.screenshot(path=str(shots / "run-cancelled.png"), full_page=True)
    # resumed from its page, it plays again; cancelled once more (its rounds take a while)
    page.click("#resume")
    page.wait_for_url(f"**/runs/{rid2}?msg=resume*")
    page.wait_for_function("() => ['spawning', 'running'].includes(document.getElementById('status').textContent)",
                           timeout=60_000)
    page.click("#cancel")
    page.wait_for_url(f"**/runs/{rid2}?msg=cancel*")
    page.wait_for_function("() => document.getElementById('status').textContent === 'cancelled'", timeout=60_000)

    # the runs list, live: both runs with their final status
    page.goto(base + "/runs")
    page.wait_for_function(f"() => document.querySelector('tr[data-run=\"{rid}\"]')?.dataset.status === 'done' && "
                           f"document.querySelector('tr[data-run=\"{rid2}\"]')?.dataset.status === 'cancelled'",
                           timeout=30_000)
    page.screenshot(path=str(shots / "runs.png"), full_page=True)

    # one agent-host is stopped from its row (the page updates live meanwhile)
    page.goto(base + "/nodes")
    page.wait_for_function("() => document.getElementById('live').textContent === 'live'", timeout=30_000)
    host_row = page.locator(f"#node-{node_id} tr[data-proc=agent-host-2]")
    host_pid = int(host_row.get_attribute("data-pid"))
    host_row.locator("button.stop").click()
    page.wait_for_url("**/nodes?msg=*")
    assert f"node {node_id} stopped agent-host-2" in page.locator("#flash-msg").text_content()
    assert page.locator(f"#node-{node_id} tr[data-proc=agent-host-2]").count() == 0
    _until(lambda: not _alive(host_pid), 30, "the stopped agent-host gone")
    children = _tree(node.pid)
    assert children, "node A's other agent-host should be running"
    # node B's replica process and its simulated server, which node A's clean-up must leave alone
    others = _until(lambda: len(pids := _tree(other.pid)) >= 2 and pids, 30, "node B's replica process and its server")
    page.goto(base + "/nodes")
    page.locator(f"#node-{node_id} tr[data-proc=agent-host-1] a", has_text="log").click()
    page.wait_for_url(f"**/nodes/{node_id}/logs/agent-host-1")
    assert page.locator("#log").text_content().strip(), "the agent-host's log is empty"
    page.screenshot(path=str(shots / "log.png"), full_page=True)
    # node A is cleaned up: its processes gone from the page and from the machine; node B's live on
    page.goto(base + "/nodes")
    page.locator(f"#node-{node_id} form.cleanup button").click()
    page.wait_for_url("**/nodes?msg=*")
    cleaned = page.locator("#flash-msg").text_content()
    assert cleaned.strip().endswith(f"node {node_id} cleaned up: agent-host-1"), cleaned
    assert page.locator(f"#node-{node_id} tr[data-proc]").count() == 0
    _until(lambda: not any(_alive(pid) for pid in children), 30, "node A's children gone")
    assert _tree(node.pid) == []
    assert node.poll() is None and other.poll() is None  # both daemons live on
    assert all(_alive(pid) for pid in others), "node B's processes were touched by node A's clean-up"
    assert page.locator(f"#node-{other_id} tr[data-proc=replicas-1]").get_attribute("data-state") == "running"
    page.screenshot(path=str(shots / "nodes-clean.png"), full_page=True)
    assert errors == []
