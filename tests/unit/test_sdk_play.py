"""Playing rounds (populace.sdk.play, .local): a user agent's bug or an outage is that agent's
invalid outcome and the round goes on; a bad value never poisons a batch; groups settle whole;
and a run gives identical rounds on one host, on several, and one agent per process."""

from __future__ import annotations

import pytest
from populace_ratio_game import Guess, Player, RatioGame

from populace.core.contracts import RunConfig
from populace.core.ranges import outside
from populace.sdk import GroupEnv, InferError, ScriptedLLM
from populace.sdk.hosting import host_run
from populace.sdk.llm import ModelUnavailable
from populace.sdk.local import run_local
from populace.sdk.play import OutcomeSink, RoundFailed
from populace.sdk.registry import resolve


def share(agents: int = 10, config: RunConfig | None = None):
    resolved = resolve(config or RunConfig(agents=agents))
    return host_run(resolved, "r", [(0, resolved.config.agents)], freeze=False)


async def play(run, llm, batch_size: int = 1000):
    batches = []
    sink = OutcomeSink(type(run.sim), run.env, batch_size=batch_size, emit=batches.append,
                       grouped=run.tables.grouped)
    await run.player.play(run.observation(1, None), llm, sink)
    return sink.close(), batches


async def test_answers_become_outcome_columns_in_batches():
    run = share(10)
    result, batches = await play(run, ScriptedLLM(lambda key, _: f'{{"guess": {key * 10}}}'), batch_size=4)
    assert [len(b.agent_ids) for b in batches] == [4, 4, 2]
    ids = [i for b in batches for i in b.agent_ids]
    values = [v for b in batches for v in b.columns["value"]]
    assert sorted(zip(ids, values)) == [(i, float(i * 10)) for i in range(10)]
    assert (result.n, result.n_valid, result.batches) == (10, 10, 3)
    assert result.partial.n_valid == 10 and result.partial.total == 450.0


async def test_an_agent_that_raises_is_its_invalid_outcome_and_the_model_keeps_its_invalid_text():
    run = share(3)
    script = {0: '{"guess": 5}', 1: ValueError("my bug"), 2: "not json"}
    _, (batch,) = await play(run, ScriptedLLM(script))
    rows = {i: (v, ok, raw, err) for i, v, ok, raw, err in
            zip(batch.agent_ids, batch.columns["value"], batch.valid, batch.raws, batch.errors)}
    assert rows[0] == (5.0, True, '{"guess": 5}', None)
    assert rows[1][:2] == (None, False) and rows[1][3] == "agent: ValueError: my bug"
    assert rows[2] == (None, False, "not json", None)  # the model's own invalid answer keeps its text
    result, _ = await play(share(3), ScriptedLLM(script))
    assert (result.n, result.n_valid, result.n_simulation_errors) == (3, 1, 1)  # the bug is not the model's


async def test_no_model_is_never_an_answer_the_round_stops_with_model_unavailable():
    run = share(6)
    script = {0: '{"guess": 5}', 1: '{"guess": 6}', 2: InferError("gateway down"), 3: '{"guess": 7}',
              4: '{"guess": 8}', 5: '{"guess": 9}'}
    with pytest.raises(ModelUnavailable, match="gateway down"):
        await play(run, ScriptedLLM(script))


class Sloppy(Player):
    __slots__ = ()

    async def turn(self, obs, llm):
        if self.id == 1:
            return Guess(value="lots", raw="lots")  # type: ignore[arg-type] - the bug under test
        if self.id == 3:
            return Guess(value=7.0, raw=None)  # type: ignore[arg-type] - raw must be text
        if self.id == 2:
            return {"value": 3}  # not an outcome at all
        return await super().turn(obs, llm)


class SloppyGame(RatioGame):
    Agent = Sloppy


async def test_a_bad_value_fails_its_row_not_the_batch():
    run = share(config=RunConfig(simulation=f"{__name__}:SloppyGame", agents=4))
    result, (batch,) = await play(run, ScriptedLLM('{"guess": 7}'))
    rows = dict(zip(batch.agent_ids, zip(batch.columns["value"], batch.valid, batch.errors)))
    assert rows[0] == (7.0, True, None)
    assert rows[1][:2] == (None, False) and rows[1][2].startswith("agent: outcome.value:")
    # only the bad column is reset: the row's other values stay (a group env may have filled them)
    assert rows[3][:2] == (7.0, False) and rows[3][2].startswith("agent: outcome.raw:")
    assert dict(zip(batch.agent_ids, batch.raws))[3] == "None"
    assert rows[2][:2] == (None, False) and "turn returned dict, not Guess" in rows[2][2]
    assert result.n == 4 and result.n_valid == 1


class Pairs(GroupEnv):
    def settle(self, round, group, agent_ids, outcomes):
        assert list(agent_ids) == sorted(agent_ids)  # members arrive sorted, whatever finished first
        return {"group": group, "total": sum(o.value or 0 for o in outcomes)}


class Boom(Pairs):
    def settle(self, round, group, agent_ids, outcomes):
        if group == 1:
            raise OverflowError("too much")
        return super().settle(round, group, agent_ids, outcomes)


class Listener(Player):
    __slots__ = ()
    heard: dict = {}

    def settled(self, outcome, news):
        Listener.heard[self.id] = news


class PairGame(RatioGame):
    name = "pair-game"
    Agent = Listener
    GroupEnv = Pairs
    outcome_table = "pair_guesses"
    summary_table = "pair_rounds"

    def group_size(self):
        return 2


async def test_groups_settle_whole_and_members_hear_the_news():
    Listener.heard = {}
    run = share(config=RunConfig(simulation=f"{__name__}:PairGame", agents=5))
    _, batches = await play(run, ScriptedLLM(lambda key, _: f'{{"guess": {key}}}'), batch_size=100)
    (batch,) = batches
    assert sorted(zip(batch.agent_ids, batch.group_ids)) == [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2)]
    assert Listener.heard == {0: {"group": 0, "total": 1}, 1: {"group": 0, "total": 1},
                              2: {"group": 1, "total": 5}, 3: {"group": 1, "total": 5},
                              4: {"group": 2, "total": 4}}  # the last group is smaller, not dropped


class BoomGame(PairGame):
    GroupEnv = Boom


async def test_a_group_env_that_raises_fails_the_round_with_its_name():
    run = share(config=RunConfig(simulation=f"{__name__}:BoomGame", agents=4))
    with pytest.raises(RoundFailed, match=r"Boom.settle raised in round 1 \(group 1\): OverflowError: too much"):
        await play(run, ScriptedLLM('{"guess": 1}'))


def rounds_of(result) -> dict:
    return {k: v for k, v in result.rounds.items() if k != "closed_at"}


def outcomes_of(result) -> dict:
    return {k: v for k, v in result.outcomes.items() if k != "latency_ms"}


@pytest.mark.parametrize("simulation", ["ratio-game", f"{__name__}:PairGame"])
async def test_a_run_is_identical_on_one_host_on_several_and_one_agent_per_process(simulation):
    config = RunConfig(simulation=simulation, agents=23, rounds=3, seed=3, model={"seed": 5})
    one = await run_local(config)
    assert len(one.outcomes["agent_id"]) == 69 and one.rounds["round"] == [1, 2, 3]
    for other in (await run_local(config, hosts=3), await run_local(config, hosts=2, one_per_process=True)):
        assert rounds_of(other) == rounds_of(one)
        assert outcomes_of(other) == outcomes_of(one)


async def test_the_local_ratio_game_matches_the_recorded_fleet_figures():
    # The README's demo table (1,000 agents, 3 rounds, dummy model, seed 0), played on the fleet.
    r = await run_local(RunConfig(agents=1000, rounds=3))
    assert [round(m, 2) for m in r.rounds["mean"]] == [50.68, 47.91, 50.19]
    assert r.rounds["winner_agent_id"] == [54, 103, 102]


async def test_a_reduce_that_raises_fails_the_round_with_its_name():
    run = share(10)

    def boom(agent_ids, outcomes):
        raise KeyError("oops")

    run.env.reduce = boom  # type: ignore[method-assign]
    batches = []
    sink = OutcomeSink(type(run.sim), run.env, batch_size=4, emit=batches.append)
    await run.player.play(run.observation(1, None), ScriptedLLM('{"guess": 3}'), sink)
    with pytest.raises(RoundFailed, match=r"RatioEnv.reduce raised: KeyError: 'oops'"):
        sink.close()
    assert sum(len(b.agent_ids) for b in batches) == 10  # every outcome still went out


def test_a_valid_value_outside_the_declared_range_is_an_invalid_row_before_it_counts():
    """The ratio game declares guesses in [0, 100]: a valid 150 (the model's answer, let through
    by a parser) becomes the model's invalid answer, named, before the partial counts it, as the
    recorder would refuse the batch."""
    run = share(3)
    batches = []
    sink = OutcomeSink(type(run.sim), run.env, batch_size=10, emit=batches.append)
    guess = type(run.sim).Outcome
    for i, v in enumerate((10.0, 150.0, 100.0)):
        sink.add(i, guess(value=v, valid=True, raw=str(v)), 1.0)
    result = sink.close()
    [b] = batches
    assert b.valid == [True, False, True] and b.columns["value"] == [10.0, None, 100.0]
    assert b.errors[1] == "answer: outcome.value: 150.0 is outside the simulation's range [0, 100]"
    assert (result.n, result.n_valid, result.n_simulation_errors) == (3, 2, 0)


def test_the_range_check_finds_exactly_the_valid_values_outside():
    assert outside([1.0, None, 5.0], [True, False, True], (0, 10)) == []
    assert outside([1.0, -1.0, 50.0, 99.0], [True, True, False, True], (0, 10)) == [1, 3]
    assert outside([], [], (0, 1)) == []


def test_a_valid_categorical_value_outside_the_declared_options_is_an_invalid_row_before_it_counts():
    """A vote declares its ballot's options: a valid "maybe" (a parser that let the model's text
    through) becomes the model's invalid answer, named, before the partial counts it — as the
    recorder would refuse the batch. Before issue 25 it counted as a new option; before issue 37
    as the simulation's error."""
    run = share(config=RunConfig.model_validate({"simulation": "vote", "agents": 3,
                                                 "ballot": {"options": ["go", "stay"]}}))
    batches = []
    sink = OutcomeSink(type(run.sim), run.env, batch_size=10, emit=batches.append)
    choice = type(run.sim).Outcome
    for i, v in enumerate(("go", "maybe", "stay")):
        sink.add(i, choice(choice=v, valid=True, raw=v), 1.0)
    result = sink.close()
    [b] = batches
    assert b.valid == [True, False, True] and b.columns["choice"] == ["go", None, "stay"]
    assert b.errors[1] == "answer: outcome.choice: 'maybe' is not one of the options ('go', 'stay')"
    assert b.raws[1] == "maybe"  # the text stays
    assert (result.n, result.n_valid, result.n_simulation_errors) == (3, 2, 0) and result.partial.counts == [1, 1]


def test_declared_options_are_a_literal_columns_values_or_the_simulations_own():
    from populace_vote import Vote, VoteParams

    assert Vote.tables_for(VoteParams.model_validate({"ballot": {"options": ["b", "a", "c"]}})).measure_options \
        == ["b", "a", "c"]  # the ballot's order, never by frequency
    assert RatioGame.tables_for(RatioGame.Params()).measure_options is None  # numeric: a range instead
