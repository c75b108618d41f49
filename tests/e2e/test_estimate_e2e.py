"""`populace run --estimate` on simulated vLLM replicas (real replica processes that count
tokens and cache prompt prefixes): the pilot plays a share of the agents for one round, and the
estimate it prints covers what the whole run then uses — on two priced models, within 20% of the
run's real tokens and dollars, which `populace results` shows per round and per model. A dollar
budget pauses a run before the round that would pass it, and `resume --budget-dollars` raises it.

The stack mostly waits on its replicas' emulated latency (one process for the services)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading

import pytest
import yaml

from populace.client.run import run_state
from populace.core import bus
from populace.replicas.launch import register_forever, start_sim, wait_healthy

pytestmark = pytest.mark.e2e

SCENARIO = {"agents": 400, "rounds": 1, "seed": 5, "model": {"backend": "sim", "seed": 9}}
# two simulated providers, their replicas registered for them (as by populace replicas sim --serves NAME);
# dollars per million tokens: cheap serves cached prompt tokens at a quarter of its input price
CHEAP = {"name": "cheap", "kind": "sim", "share": 0.5, "prices": {"input": 0.5, "cached_input": 0.125, "output": 1.5},
         "limits": {"requests_per_min": 6000, "concurrency": 8}}
DEAR = {"name": "dear", "kind": "sim", "share": 0.5, "prices": {"input": 5.0, "output": 15.0}}
PRICED = {"agents": 200, "rounds": 3, "seed": 11, "model": {"seed": 9}, "models": [CHEAP, DEAR]}


@pytest.fixture(scope="module")
def stack(stacks):
    """No service is killed or measured alone: the services share one process. The three replica
    sets' simulated servers (the default model's, cheap's and dear's) are processes of their own,
    as `populace replicas sim --count 1 [--serves NAME]` starts them; what that command adds around
    them (wait until healthy, heartbeat into KV `replicas`) runs in a thread here: no CLI
    interpreter per set (the command as a process: test_faults_e2e, test_retention_e2e, …)."""
    s = stacks(hosts=1, env={"POPULACE_STORAGE": "memory"}, one_process=True, timeout=120)
    sets = []
    loop = asyncio.new_event_loop()

    async def serve() -> None:
        for rs in sets:
            await wait_healthy(rs)
        # return_exceptions: cancelled, this returns once every set has deleted its key and closed its
        # connection (else the first one done would end the loop under the others' clean-up)
        beats = await asyncio.gather(*(register_forever(s.url, rs) for rs in sets), return_exceptions=True)
        for beat in beats:  # a heartbeat ends only on an error
            if isinstance(beat, BaseException):
                raise beat

    task = loop.create_task(serve())

    def run() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # how it is stopped; any other error is raised below
            loop.run_until_complete(task)

    thread = threading.Thread(target=run, name="replica-sets", daemon=True)
    try:
        for serves in (None, CHEAP["name"], DEAR["name"]):  # started here, on the main thread: they die with it
            sets.append(start_sim(1, serves=serves))
        with pytest.MonkeyPatch.context() as env:  # the settings register_forever reads as it starts
            env.setenv("POPULACE_STORAGE", "memory")
            thread.start()
            s.replicas = 3
            asyncio.run(s.wait_ready(timeout=120))
        yield s
    finally:
        if thread.is_alive():
            loop.call_soon_threadsafe(task.cancel)
            thread.join(30)
        if not thread.is_alive():
            loop.close()
        for rs in sets:
            rs.stop()
        if task.done() and not task.cancelled() and task.exception():
            raise task.exception()


def populace(cli, *args: str):
    """In process (the `cli` fixture): the pilot and the run are the stack's; no process boundary is under test."""
    return cli(*args, env={"COLUMNS": "250"})


def number(text: str) -> float:
    return float(text.replace(",", ""))


def test_the_estimate_from_a_pilot_covers_what_the_run_uses(stack, tmp_path, cli):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    r = populace(cli, "run", str(scenario), "--estimate", "--pilot", "0.1", "--nats", stack.url, "--no-progress")
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert re.search(r"pilot run \S+: 40 of 400 agents, round 1, model sim: 40 LLM calls", out), out
    m = re.search(r"expected for 400 agents × 1 rounds: 400 LLM calls, ([\d,]+) tokens "
                  r"\(95% interval ([\d,]+)–([\d,]+);", out)
    assert m, out
    expected, low, high = (number(x) for x in m.groups())
    assert 0 < low <= expected <= high

    r = populace(cli, "run", str(scenario), "--nats", stack.url, "--no-progress")  # the run itself
    assert r.returncode == 0, r.stderr
    rid = re.search(r"run (\S+) \(completed\)", r.stdout).group(1)

    async def used(nc):
        return (await run_state(nc, rid)).used

    nc_used = asyncio.run(_with_nc(stack.url, used))
    assert nc_used.llm_calls == 400
    # the pilot's agents are a sample of the same population: the truth is near the estimate
    assert low * 0.97 <= nc_used.tokens <= high * 1.03, (nc_used, expected, low, high)


async def _with_nc(url: str, work):
    nc = await bus.connect(url, "e2e-estimate")
    try:
        return await work(nc)
    finally:
        await nc.close()


def state_of(url: str, rid: str):
    async def read(nc):
        return await run_state(nc, rid)

    return asyncio.run(_with_nc(url, read))


def test_the_estimate_on_two_priced_models_is_within_a_fifth_of_the_runs_tokens_and_dollars(stack, tmp_path, cli):
    scenario = tmp_path / "priced.yaml"
    scenario.write_text(yaml.safe_dump(PRICED))
    r = populace(cli, "run", str(scenario), "--estimate", "--pilot", "0.1", "--nats", stack.url, "--no-progress")
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert re.search(r"pilot run \S+: 20 of 200 agents, round 1, models cheap, dear: 20 LLM calls", out), out
    m = re.search(r"expected for 200 agents × 3 rounds: 600 LLM calls, ([\d,]+) tokens .*?"
                  r"([\d,]+) of the prompt tokens cached, \$([\d.]+) at the models' prices", out)
    assert m, out
    tokens, cached, dollars = (number(x) for x in m.groups())
    # per model: its agents (100 each, the pilot's 10 each scaled), its dollars, its pace
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in r.stdout.splitlines() if line.startswith("│") and ("cheap" in line or "dear" in line)}
    assert rows["cheap"][:2] == ["100", "300"] and rows["dear"][:2] == ["100", "300"], r.stdout
    assert "(requests per minute binds)" in rows["cheap"][-1] or "(concurrency 8 binds)" in rows["cheap"][-1], r.stdout
    assert "model dear: no requests_per_min or tokens_per_min declared" in out, out
    assert re.search(r"wall time: at least [\d.]+ (s|min) under the declared limits", out), out

    r = populace(cli, "run", str(scenario), "--nats", stack.url, "--no-progress")
    assert r.returncode == 0, r.stderr
    rid = re.search(r"run (\S+) \(completed\)", r.stdout).group(1)
    assert "dollars" in r.stdout  # the rounds table of a run on priced models
    used = state_of(stack.url, rid).used
    assert used.llm_calls == 600 and set(used.by_model) == {"cheap", "dear"}
    assert used.by_model["cheap"].llm_calls == used.by_model["dear"].llm_calls == 300
    assert used.cached_tokens > 0  # the simulated providers served shared prompt prefixes from cache
    expected_dollars = sum(
        m_prices.dollars(u.prompt_tokens, u.cached_tokens, u.completion_tokens)
        for name, u in used.by_model.items()
        for m_prices in [next(m for m in stack_models() if m.name == name).prices])
    assert used.dollars == pytest.approx(expected_dollars)
    # the "done when": the pilot's estimate within 20% of what the run really used
    assert abs(tokens - used.tokens) <= 0.2 * used.tokens, (tokens, used)
    assert abs(dollars - used.dollars) <= 0.2 * used.dollars, (dollars, used)
    assert abs(cached - used.cached_tokens) <= 0.35 * used.cached_tokens, (cached, used)  # a cold cache in the pilot

    # populace results: per round and per model, what the rows say (the recorder's file, read live)
    r = populace(cli, "results", rid, "--json", "--db", stack.db, "--nats", stack.url)
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)["runs"][0]
    per_round = [x["usage"] for x in run["rounds"]]
    assert sum(u["dollars"] for u in per_round) == pytest.approx(used.dollars)
    assert sum(u["cached_tokens"] for u in per_round) == used.cached_tokens
    assert run["usage"]["dollars"] == pytest.approx(used.dollars)
    models = run["models"]
    assert {k: (v["agents"], v["calls"]) for k, v in models.items()} == {"cheap": (100, 300), "dear": (100, 300)}
    for name, u in used.by_model.items():  # the gateway's records agree with what the hosts counted
        assert (models[name]["prompt_tokens"], models[name]["completion_tokens"]) == (u.prompt_tokens,
                                                                                     u.completion_tokens)
        assert models[name]["dollars"] == pytest.approx(u.dollars)
    r = populace(cli, "results", rid, "--db", stack.db, "--nats", stack.url)
    assert r.returncode == 0, r.stderr
    assert "cached tokens" in r.stdout and "LLM work by model" in r.stdout and "$" in r.stdout
    # the measure per model, as `results --by model` and the manager's run page read it from the recorder
    groups = asyncio.run(_groups(stack.url, rid))
    assert groups.ok and "model" in groups.attributes, groups
    assert {g["group"]: g["n"] for g in groups.rows} == {"cheap": 100, "dear": 100}
    assert all(g["ci_low"] <= g["mean"] <= g["ci_high"] for g in groups.rows)


async def _groups(url: str, rid: str):
    from populace.client.reads import request_groups
    from populace.core import bus

    nc = await bus.connect(url, "e2e-groups")
    try:
        return await request_groups(nc, rid, "model")
    finally:
        await nc.close()


def stack_models():
    from populace.core.contracts import ModelEndpoint

    return [ModelEndpoint.model_validate(m) for m in (CHEAP, DEAR)]


def test_a_dollar_budget_pauses_the_run_at_its_cap_and_resume_raises_it(stack, tmp_path, cli):
    # the cached-input price is the input price here: a round's dollars follow its prompts alone
    flat = [{**m, "prices": {"input": m["prices"]["input"], "output": m["prices"]["output"]}} for m in (CHEAP, DEAR)]
    scenario = tmp_path / "budget.yaml"
    scenario.write_text(yaml.safe_dump({**PRICED, "agents": 60, "rounds": 3, "models": flat,
                                        "budget": {"dollars": 1e-6}}))
    r = populace(cli, "run", str(scenario), "--nats", stack.url, "--no-progress")
    # round 1 always plays; it spent past the cap, so the run pauses before round 2
    assert r.returncode == 1 and "paused" in r.stderr, (r.stdout, r.stderr)
    rid = re.search(r"run (\S+) paused", r.stderr).group(1)
    s = state_of(stack.url, rid)
    assert (s.status, s.round) == ("paused", 1)
    first = s.used.dollars
    assert first > 0 and s.reason.startswith("budget: $") and "(--budget-dollars)" in s.reason
    # a cap round 2 fits under and round 3 does not: it plays round 2 and pauses again
    cap = 2.5 * first
    r = populace(cli, "resume", rid, "--budget-dollars", f"{cap:.9f}", "--nats", stack.url, "--no-progress")
    assert r.returncode == 1 and "paused" in r.stderr, (r.stdout, r.stderr)
    s = state_of(stack.url, rid)
    assert (s.status, s.round, s.config.budget.dollars) == ("paused", 2, pytest.approx(cap))
    assert s.used.dollars <= cap < s.used.dollars + s.last_round.dollars
    # the same cap is refused at once (it would pause again); a larger one plays the run to its end
    r = populace(cli, "resume", rid, "--budget-dollars", f"{cap:.9f}", "--nats", stack.url, "--no-progress")
    assert r.returncode == 1 and "--budget-dollars): give a larger budget" in r.stderr, (r.stdout, r.stderr)
    assert state_of(stack.url, rid).round == 2
    r = populace(cli, "resume", rid, "--budget-dollars", "1", "--nats", stack.url, "--no-progress")
    assert r.returncode == 0, (r.stdout, r.stderr)
    s = state_of(stack.url, rid)
    assert (s.status, s.round, s.used.llm_calls) == ("done", 3, 180)
