"""A run's config is validated once per run by each service that needs it, not once per round
or per message (populace_run_configs_validated_total counts every validation, nested ones
too), and spawns and round opens name it by digest instead of carrying it."""

from __future__ import annotations

import asyncio
import json

import pytest
from test_metrics_scrape import scrape, total

from populace.client.prepare import prepare
from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus, subjects
from populace.core.contracts import ConfigRef, RunConfig

pytestmark = pytest.mark.e2e

AGENTS, ROUNDS, HOSTS = 40, 4, 1  # one host: every host reads the config as its spawn names it
VALIDATED = "populace_run_configs_validated_total"


def test_each_service_validates_a_runs_config_once_and_round_opens_name_it_by_digest(tmp_path):
    stack = Stack(hosts=HOSTS, db=str(tmp_path / "c.duckdb"), env={"POPULACE_STORAGE": "memory"}, metrics=True)
    with stack.up(timeout=120):
        before = {key: total(scrape(port), VALIDATED) for key, port in stack.metrics_ports.items()}

        async def go():
            nc = await bus.connect(stack.url, "config-once-e2e")
            try:
                # as `populace run` submits it: prepared (resolved) by the client
                prepared = prepare(RunConfig.model_validate({"agents": AGENTS, "rounds": ROUNDS,
                                                             "model": {"latency_s": 0}}))
                out = await play(nc, prepared.config, stall_s=120)
                js = nc.jetstream()
                opens = [await js.get_last_msg(subjects.RUN_STREAM, subjects.run_round_open(out.run_id, n))
                         for n in range(1, ROUNDS + 1)]
                return out, [json.loads(m.data) for m in opens]
            finally:
                await nc.close()

        out, opens = asyncio.run(go())
        assert out.status == "completed", out.reason
        after = {key: total(scrape(port), VALIDATED) for key, port in stack.metrics_ports.items()}

    counted = {key: after[key] - before[key] for key in after}
    print("validations per service:", counted)
    assert counted["orchestrator"] == 1  # its start (resolved as it came: not validated again)
    assert counted["environment"] == 1  # read once by digest, for the first round it decides
    for i in range(HOSTS):
        assert counted[f"agent-host-{i}"] == 1  # read by the digest its spawn names; no round open re-reads it
    assert counted["recorder"] == 1  # the run's start: a spawn names the config by digest, never carries it
    assert counted["gateway"] == 0
    refs = {json.dumps(o["config_ref"], sort_keys=True) for o in opens}
    assert len(refs) == 1 and all("config" not in o for o in opens)
    assert ConfigRef.model_validate_json(refs.pop()).from_round == 1
