"""The environment service's pure core: a round closes once every live share's partial is in,
whatever order partials and the round open arrive in; a share counts once; a share a
re-placement replaced never counts, and the round is decided again with its replacement; a
partial whose payload is not the simulation's (or that counts more agents than its share
has) is refused; a simulation env that raises is named."""

from __future__ import annotations

import pytest
from populace_ratio_game.rules import partial_of

from populace.core.contracts import ConfigRef, RoundOpen, RoundPartial, RunConfig, RunHead, Share, StateRef
from populace.environment.run_tally import BadPartial, EnvironmentFailed, RunTally
from populace.sdk.registry import resolve

CONFIG = RunConfig(agents=7, rounds=3)
H1 = [(0, 10.0), (1, 20.0), (2, None), (3, 90.0)]  # 4 agents
H2 = [(4, 30.0), (5, 30.0), (6, 50.0)]  # 3 agents


def tally(config: RunConfig = CONFIG) -> RunTally:
    resolved = resolve(config)
    return RunTally("r1", resolved, resolved.simulation.Env(resolved.instance("r1")))


SHARES = {"h1@0": 4, "h2@0": 3}


def opened(round_: int = 1, expected: int = 7, state: StateRef | None = None, shares: dict | None = None,
           epoch: int = 0) -> RoundOpen:
    return RoundOpen(run_id="r1", round=round_, expected=expected, config_ref=ConfigRef.of(CONFIG), env_state=state,
                     opened_at=0.0, shares=SHARES if shares is None else shares, epoch=epoch)


def partial(host: str, guesses, round_: int = 1, epoch: int = 0) -> RoundPartial:
    p = partial_of(guesses)
    return RoundPartial(run_id="r1", round=round_, host_id=host, n=len(guesses), n_valid=p.n_valid,
                        payload=p.model_dump(mode="json"), epoch=epoch)


def test_round_closes_only_when_all_expected_reported():
    t = tally()
    assert t.open(opened()) is None
    assert t.add(partial("h1", H1)) is None
    res = t.add(partial("h2", H2))
    assert res is not None and (res.run_id, res.round, res.n, res.n_valid) == ("r1", 1, 7, 6)
    assert res.shares == ["h1@0", "h2@0"]
    # mean 230/6, target 2/3 of it = 25.6: the closest guesses are the two 30s, agent 4 the smaller id
    assert res.summary["mean"] == pytest.approx(230 / 6) and res.summary["winner_agent_id"] == 4
    assert res.summary["n_winners"] == 2
    assert t.states_out[1] == {"winners": [30.0]} and res.observation == {"round": 2, "history": [30.0]}


def test_partials_before_the_open_wait_for_it_and_replays_count_once():
    t = tally()
    assert t.add(partial("h1", H1)) is None
    assert t.add(partial("h1", H1)) is None  # a replay: would make 8 >= 7 if counted twice
    assert t.add(partial("h2", H2)) is None  # all in, but the round is not open yet
    res = t.open(opened())
    assert res is not None and res.n == 7
    assert t.add(partial("h2", H2)) is None and t.open(opened()) is None  # closed rounds stay closed


def test_the_decision_does_not_depend_on_arrival_order():
    a, b = tally(), tally()
    a.open(opened()), a.add(partial("h1", H1))
    ra = a.add(partial("h2", H2))
    b.add(partial("h2", H2)), b.add(partial("h1", H1))
    rb = b.open(opened())
    assert ra.summary == rb.summary and a.states_out[1] == b.states_out[1]


def test_state_carries_over_and_a_straggler_of_an_earlier_round_changes_nothing():
    t = tally()
    t.open(opened(1))
    t.add(partial("h1", H1, round_=1))
    assert t.add(partial("h2", H2, round_=1)).round == 1
    decided = StateRef(name="r1.1.env", digest="a" * 64)  # as the service stores round 1's
    t.keep_state(decided, t.states_out.pop(1))
    read = StateRef(name="r1.1.env", digest="b" * 64)  # another state: e.g. read after a restart
    assert t.needs_state(opened(2, state=decided)) is None and t.needs_state(opened(2, state=read)) == read
    t.keep_state(read, {"winners": [99.0]})
    t.open(opened(2, state=read))
    assert list(t.states) == [read]  # the round starts from the one its open names: the other is let go
    assert t.add(partial("h2", H2, round_=1)) is None  # round 1 again: decided long ago
    t.add(partial("h1", H1, round_=2))
    r2 = t.add(partial("h2", H2, round_=2))
    assert r2.round == 2 and t.states_out[2] == {"winners": [99.0, 30.0]}  # the state the round open named


def test_a_round_whose_state_was_not_read_fails_naming_it():
    t = tally()
    t.open(opened(2, state=StateRef(name="r1.1.env", digest="a" * 64)))
    t.add(partial("h1", H1, round_=2))
    with pytest.raises(EnvironmentFailed, match=r"round 2's state r1.1.env was not read"):
        t.add(partial("h2", H2, round_=2))


def test_a_share_placed_again_replaces_the_lost_one_and_the_round_is_decided_again():
    """h2 stopped in round 1 after its partial; its agents were placed on h1 (share h1@1),
    which replays them: the round is decided again from h1@0 and h1@1, and h2@0 never counts."""
    t = tally()
    t.open(opened())
    t.add(partial("h1", H1))
    first = t.add(partial("h2", H2))
    assert first.shares == ["h1@0", "h2@0"]
    moved = {"h1@0": 4, "h1@1": 3}
    assert t.open(opened(shares=moved, epoch=1)) is None  # waiting for the replacement
    assert t.add(partial("h2", H2)) is None  # the lost share's partial again: not a share any more
    again = t.add(partial("h1", [(4, 31.0), (5, 30.0), (6, 50.0)], epoch=1))
    assert again.shares == ["h1@0", "h1@1"] and again.epoch == 1 and again.n == 7
    assert again.summary["mean"] != first.summary["mean"]  # decided from the replacement's answers
    assert t.open(opened()) is None  # the older announcement changes nothing
    assert t.add(partial("h1", [(4, 31.0), (5, 30.0), (6, 50.0)], epoch=1)) is None  # decided once


def test_a_replacements_partial_may_come_before_its_announcement():
    t = tally()
    t.open(opened())
    t.add(partial("h1", H1))
    assert t.add(partial("h3", H2, epoch=1)) is None  # h3@1 is not announced yet: it waits
    res = t.open(opened(shares={"h1@0": 4, "h3@1": 3}, epoch=1))
    assert res is not None and res.shares == ["h1@0", "h3@1"]


def test_a_partial_from_a_share_never_placed_or_counting_other_than_its_agents_is_refused():
    t = tally()
    t.open(opened())
    with pytest.raises(BadPartial, match=r"share intruder@0 was never placed in run r1 \(round 1, epoch 0\)"):
        t.add(partial("intruder", H2))
    with pytest.raises(BadPartial, match="share h2@0 has 3 agents, the partial counts 4"):
        t.add(partial("h2", H1))
    with pytest.raises(BadPartial, match="share h2@0 has 3 agents, the partial counts 2"):
        t.add(partial("h2", H2[:2]))
    assert t.add(partial("h1", H1)) is None
    assert t.add(partial("h2", H2)).n == 7


def test_a_partial_for_a_round_not_open_is_refused_and_early_ones_are_checked_when_it_opens():
    t = tally()
    t.open(opened())
    with pytest.raises(BadPartial, match=r"round 3 is not open in run r1 \(round 1 is in play\)"):
        t.add(partial("h1", H1, round_=3))
    # round 2's partials may come before its announcement; the announcement checks them
    assert t.add(partial("h1", H1[:3], round_=2), source="m1") is None
    assert t.add(partial("forged", H2, round_=2), source="m2") is None
    assert t.add(partial("h2", H2, round_=2), source="m3") is None
    assert t.open(opened(2)) is None  # h1's was refused: the round waits for a good one
    assert sorted((r.source, r.reason) for r in t.refused) == [
        ("m1", "share h1@0 has 4 agents, the partial counts 3"),
        ("m2", "share forged@0 was never placed in run r1 (round 2, epoch 0)")]
    assert t.add(partial("h1", H1, round_=2)).n == 7


def test_a_round_with_only_invalid_answers_still_closes():
    t = tally()
    t.open(opened(expected=2, shares={"h1@0": 2}))
    res = t.add(partial("h1", [(0, None), (1, None)]))
    assert res.n_valid == 0 and res.summary["winner_agent_id"] is None and t.states_out[1] == {"winners": []}


def test_a_payload_that_is_not_the_simulations_partial_is_refused():
    t = tally()
    t.open(opened())
    bad = RoundPartial(run_id="r1", round=1, host_id="h2", n=3, n_valid=3, payload={"total": "lots"})
    with pytest.raises(BadPartial, match="not a GuessPartial"):
        t.add(bad)
    assert t.add(partial("h1", H1)) is None  # the refused partial was not counted


def test_an_environment_that_raises_is_named_with_its_round():
    t = tally()

    def boom(*_):
        raise ZeroDivisionError("oops")

    t.env.decide = boom  # type: ignore[method-assign]
    t.open(opened(round_=1, expected=4, shares={"h1@0": 4}))
    with pytest.raises(EnvironmentFailed, match=r"simulation 'ratio-game'.*round 1: ZeroDivisionError: oops"):
        t.add(partial("h1", H1))


def test_the_simulations_own_errors_are_summed_apart_from_the_models_invalid_answers():
    """Issue 25: an author's bug (error 'agent: …') counted as the model's invalid answer."""
    t = tally()
    t.open(opened())
    t.add(partial("h1", H1).model_copy(update={"n_simulation_errors": 1}))
    res = t.add(partial("h2", H2))
    assert (res.n, res.n_valid, res.n_simulation_errors) == (7, 6, 1)


def test_a_partial_counting_more_errors_than_invalid_rows_is_refused():
    with pytest.raises(ValueError, match=r"n_simulation_errors \(2\) cannot exceed the invalid rows \(1\)"):
        RoundPartial(run_id="r1", round=1, host_id="h1", n=3, n_valid=2, payload={}, n_simulation_errors=2)


def test_a_partial_whose_run_is_looked_up_while_its_round_opens_is_counted_not_kept_early():
    """The environment service's race (CI, bad-input e2e): a partial comes before its round's
    announcement, and while the service looks the run up (KV), the announcement is handled and
    takes the early partials. The partial must then count toward the round: kept as early, it
    waited for good and the round never closed."""
    import asyncio
    from types import SimpleNamespace

    from populace.environment.app import Environment

    env = Environment(SimpleNamespace(js=None, log=None))
    t = tally()
    counted: list[RoundPartial] = []

    async def head_of(run_id: str) -> RunHead:
        env.runs[run_id] = t  # the round opened meanwhile (on_round_open took `early`, empty then)
        env.early.pop(run_id, None)
        return RunHead(run_id=run_id, status="running", shares=[Share(host_id="h1", ranges=[(0, 4)])])

    async def count(tally_, partial_, msg, reject=False) -> None:
        counted.append(partial_)

    env.head_of = head_of  # type: ignore[method-assign]
    env.count = count  # type: ignore[method-assign]
    p = partial("h1", H1)
    msg = SimpleNamespace(raw_message=SimpleNamespace(subject="run.r1.partial.1.h1.0"))
    asyncio.run(env.on_partial(p, msg))  # type: ignore[arg-type]
    assert counted == [p] and env.early == {}


def test_screen_says_what_the_placement_says_before_a_payload_is_looked_at():
    """Issue 41, item 3: a partial by reference is read only once screen() says it counts (True),
    or, its round not announced yet (None), the run's placement in KV lists its share."""
    t = tally()
    unread = {"$ref": "never read", "sha256": "0" * 64, "size": 1 << 30}
    assert t.screen(partial("h1", H1).model_copy(update={"payload": unread})) is None  # nothing announced yet
    t.open(opened(1))
    assert t.screen(partial("h1", H1).model_copy(update={"payload": unread})) is True
    with pytest.raises(BadPartial, match=r"share h9@0 was never placed in run r1 \(round 1, epoch 0\)"):
        t.screen(partial("h9", H1).model_copy(update={"payload": unread}))
    with pytest.raises(BadPartial, match="share h1@0 has 4 agents, the partial counts 5"):
        t.screen(partial("h1", [*H1, (9, 1.0)]))
    assert t.screen(partial("h1", H1, round_=2)) is None  # the next round: its announcement decides
    with pytest.raises(BadPartial, match=r"round 3 is not open in run r1 \(round 1 is in play\)"):
        t.screen(partial("h1", H1, round_=3))
    t.open(opened(2, epoch=1, shares={"h3@1": 7}))
    assert t.screen(partial("h1", H1, round_=2)) is False  # a replaced share's straggler
    assert t.screen(partial("h1", H1, round_=1)) is False  # a decided round's


def test_a_partial_reference_and_its_size_limit():
    from populace.core.contracts import PartialRef, partial_object_limit

    ref = PartialRef.model_validate({"$ref": "r1.1.partial.h1-0", "sha256": "a" * 64, "size": 300_000})
    assert ref.model_dump() == {"$ref": "r1.1.partial.h1-0", "sha256": "a" * 64, "size": 300_000}
    assert PartialRef.of(ref.model_dump()) and not PartialRef.of({"sum": 1}) and not PartialRef.of([])
    assert partial_object_limit(0) == 1 << 20 and partial_object_limit(100_000) == (1 << 20) + 25_600_000
