"""`populace run` on a bad scenario exits 2 naming the field and publishes nothing on a real
nats-server: the CTL stream holds as many messages after as before. In process (the `cli`
fixture: typer's runner on the real app); tests/e2e/test_cli.py runs one as a real process."""

from __future__ import annotations

import asyncio

import pytest

from populace.core import bus, subjects

pytestmark = pytest.mark.integration

GOOD = """\
name: guess-two-thirds
agents: 1000
rounds: 3
game: {ratio: "2/3", offset: 0, max_value: 100}
model: {backend: dummy, latency_s: 0.05}
placement: {agents_per_process: 0}
"""


@pytest.mark.parametrize("yaml_text, field", [
    (GOOD + "colour: blue\n", "colour"),
    (GOOD.replace('ratio: "2/3"', "ratio: 0"), "game.ratio"),
    (GOOD.replace('ratio: "2/3"', "ratio: -1/3"), "game.ratio"),
    (GOOD.replace('ratio: "2/3"', 'ratio: "two thirds"'), "game.ratio"),
    (GOOD.replace("rounds: 3", "rounds: 0"), "rounds"),
    (GOOD.replace("agents: 1000", "agents: 0"), "agents"),
    (GOOD.replace("agents: 1000", "agents: many"), "agents"),
    (GOOD.replace("latency_s: 0.05", "latency_s: soon"), "model.latency_s"),
    (GOOD.replace("max_value: 100", "max_value: lots"), "game.max_value"),
    (GOOD.replace("backend: dummy", "backend: gpt-17"), "model.backend"),
    (GOOD.replace("game: {", "game: {shape: round, "), "game.shape"),
    (GOOD.replace("agents_per_process: 0", "agents_per_process: 3"), "placement.agents_per_process"),
    (GOOD + "simulation: chess\n", "simulation: unknown simulation 'chess'"),
    (GOOD + "simulation: no_such_pkg:Sim\n", "cannot import: ModuleNotFoundError"),
    ("simulation: public-goods\nagents: 4\ngame: {group_size: 5}\n", "game.group_size: 5 is more than"),
    ("simulation: vote\nballot: {options: [yes, yes]}\n", "ballot.options.0"),
])
def test_bad_scenario_exits_2_naming_the_field_and_publishes_nothing(cli, tmp_path, nats_server, yaml_text, field):
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml_text)

    async def ctl_messages() -> int:
        nc = await bus.connect(nats_server.url, "cli-test")
        js = nc.jetstream()
        await bus.provision(js, storage="memory")
        n = (await js.stream_info(subjects.CTL_STREAM)).state.messages
        await nc.close()
        return n

    before = asyncio.run(ctl_messages())
    res = cli("run", str(path), "--nats", nats_server.url, "--no-progress")
    assert res.returncode == 2, res.stderr
    assert field in res.stderr
    assert asyncio.run(ctl_messages()) == before
