"""`populace run --estimate` on simulated vLLM replicas (a real replica process that counts
tokens): the pilot plays a share of the agents for one round, and the estimate it prints
covers what the whole run then uses."""

from __future__ import annotations

import asyncio
import re

import pytest
import yaml

from populace.client.run import run_state
from populace.core import bus

pytestmark = pytest.mark.e2e

SCENARIO = {"agents": 400, "rounds": 1, "seed": 5, "model": {"backend": "sim", "seed": 9}}


@pytest.fixture(scope="module")
def stack(stacks):
    """No service is killed or measured alone: the services share one process (the replica has its own)."""
    return stacks(hosts=1, env={"POPULACE_STORAGE": "memory"}, one_process=True, timeout=120,
                  extra={"replicas-sim": ["replicas", "sim", "--count", "1"]}, replicas=1)


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
