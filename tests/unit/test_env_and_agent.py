"""SDK Agent/Env behaviour, the game environment's round closing, and the dummy backend."""

from __future__ import annotations

import asyncio

import pytest

from populace.core.contracts import GameConfig, HostPartial, InferBatch, ModelConfig, RoundResult
from populace.games.env import RatioGameEnv
from populace.games.parsing import parse_guess
from populace.games.rules import PartialBuilder, decide_round, merge
from populace.gateway.backends.dummy import DummyBackend, seeded_value
from populace.sdk.agent import Agent
from populace.sdk.env import Env

GAME = GameConfig(ratio="2/3")


def partial(host_id: str, guesses: list[tuple[int, float | None]], round_: int = 1,
            run_id: str = "r1") -> HostPartial:
    b = PartialBuilder()
    for a, v in guesses:
        b.add(a, v)
    return b.build(run_id, round_, host_id)


def recorder(env: Env, event: str = "round.result") -> list:
    seen: list = []
    env.listen(event, lambda ev, payload: seen.append((ev, payload)))
    return seen


# --- RatioGameEnv ---------------------------------------------------------------------------------
H1 = [(0, 10.0), (1, 20.0), (2, None), (3, 90.0)]  # 4 agents
H2 = [(4, 30.0), (5, 30.0), (6, 50.0)]  # 3 agents


async def test_round_closes_only_when_all_expected_reported():
    env = RatioGameEnv("r1")
    seen = recorder(env)
    assert await env.open_round(1, 7, GAME) is None
    assert await env.report(partial("h1", H1)) is None
    assert seen == [] and env.results == {}
    res = await env.report(partial("h2", H2))
    assert isinstance(res, RoundResult)
    assert (res.run_id, res.round, res.n, res.n_valid) == ("r1", 1, 7, 6)
    expected = decide_round("r1", 1, merge([partial("h1", H1), partial("h2", H2)]), GAME, res.closed_at)
    assert res == expected
    assert env.results[1] == res and env.history == [res]
    assert seen == [("round.result", res)]


async def test_partial_before_open_is_buffered():
    env = RatioGameEnv("r1")
    seen = recorder(env)
    assert await env.report(partial("h1", H1)) is None
    assert await env.report(partial("h2", H2)) is None  # all in, but the round is not open yet
    assert seen == [] and env.results == {}
    res = await env.open_round(1, 7, GAME)
    assert res is not None and res.n == 7
    assert seen == [("round.result", res)]


async def test_duplicate_partial_from_same_host_counts_once():
    env = RatioGameEnv("r1")
    seen = recorder(env)
    await env.open_round(1, 7, GAME)
    assert await env.report(partial("h1", H1)) is None
    assert await env.report(partial("h1", H1)) is None  # replay: would make 8 >= 7 if counted twice
    assert seen == []
    res = await env.report(partial("h2", H2))
    assert res is not None and res.n == 7 and res.n_valid == 6
    assert len(seen) == 1


async def test_listener_receives_result_exactly_once():
    env = RatioGameEnv("r1")
    calls: list[RoundResult] = []

    async def on_result(event, payload):
        await asyncio.sleep(0)
        calls.append(payload)

    env.listen("round.result", on_result)
    await env.report(partial("h1", H1))
    await env.open_round(1, 7, GAME)
    await env.report(partial("h2", H2))
    # late replays and a second open do not fire again
    assert await env.report(partial("h2", H2)) is None
    assert await env.report(partial("h3", [(7, 1.0)])) is None
    assert await env.open_round(1, 7, GAME) is None
    assert len(calls) == 1 and calls[0].n == 7


async def test_rounds_are_independent():
    env = RatioGameEnv("r1")
    seen = recorder(env)
    await env.open_round(1, 4, GAME)
    await env.open_round(2, 3, GAME)
    assert await env.report(partial("h2", H2, round_=1)) is None  # 3 < 4 for round 1
    r2 = await env.report(partial("h2", H2, round_=2))
    assert r2 is not None and r2.round == 2
    r1 = await env.report(partial("h1", H1, round_=1))
    assert r1 is not None and r1.round == 1 and r1.n == 7
    assert [r.round for r in env.history] == [1, 2]
    assert [p.round for _, p in seen] == [2, 1]


async def test_round_with_only_invalid_answers_still_closes():
    env = RatioGameEnv("r1")
    await env.open_round(1, 2, GAME)
    res = await env.report(partial("h1", [(0, None), (1, None)]))
    assert res is not None and res.n_valid == 0 and res.winner_agent_id is None


async def test_wildcard_listener_and_nesting():
    parent = Env("root")
    env = RatioGameEnv("r1", parent=parent)
    assert env.parent is parent and parent.children == [env]
    seen = recorder(env, "*")
    await env.open_round(1, 3, GAME)
    await env.report(partial("h2", H2))
    assert [ev for ev, _ in seen] == ["round.result"]


# --- Env ---------------------------------------------------------------------------------------
async def test_emit_calls_sync_async_and_wildcard_listeners():
    env = Env("e")
    log: list = []

    def sync_fn(ev, p):
        log.append(("sync", ev, p))

    async def async_fn(ev, p):
        await asyncio.sleep(0)
        log.append(("async", ev, p))

    def star(ev, p):
        log.append(("star", ev, p))

    def other(ev, p):
        log.append(("other", ev, p))

    env.listen("tick", sync_fn)
    env.listen("tick", async_fn)
    env.listen("*", star)
    env.listen("tock", other)
    await env.emit("tick", 1)
    assert sorted(log) == [("async", "tick", 1), ("star", "tick", 1), ("sync", "tick", 1)]
    log.clear()
    await env.emit("tock", 2)
    assert sorted(log) == [("other", "tock", 2), ("star", "tock", 2)]
    log.clear()
    await env.emit("nobody", 3)
    assert log == [("star", "nobody", 3)]


async def test_async_listeners_run_concurrently():
    env = Env("e")
    ready = asyncio.Event()

    async def waiter(ev, p):
        await ready.wait()  # only finishes if `setter` runs while this one is waiting

    async def setter(ev, p):
        await asyncio.sleep(0)
        ready.set()

    env.listen("go", waiter)
    env.listen("go", setter)
    await asyncio.wait_for(env.emit("go", None), timeout=2)


async def test_unsubscribe():
    env = Env("e")
    log: list = []
    off = env.listen("tick", lambda ev, p: log.append(p))
    off_star = env.listen("*", lambda ev, p: log.append(("*", p)))
    await env.emit("tick", 1)
    off()
    await env.emit("tick", 2)
    off_star()
    await env.emit("tick", 3)
    assert log == [1, ("*", 1), ("*", 2)]


async def test_listener_error_propagates():
    env = Env("e")

    async def boom(ev, p):
        raise RuntimeError("listener failed")

    env.listen("x", boom)
    with pytest.raises(RuntimeError, match="listener failed"):
        await env.emit("x", None)


# --- Agent ------------------------------------------------------------------------------------------
def test_agent_remember_keeps_last_memory_size_items():
    a = Agent(7, persona=3)
    assert (a.agent_id, a.persona, a.memory) == (7, 3, ())
    for i in range(3):
        a.remember(i)
    assert a.memory == (0, 1, 2)
    for i in range(3, 12):
        a.remember(i)
        assert len(a.memory) == min(i + 1, Agent.memory_size)
    assert Agent.memory_size == 5
    assert a.memory == (7, 8, 9, 10, 11)


def test_agent_memory_size_can_be_overridden():
    class Short(Agent):
        memory_size = 2

    a = Short(1)
    for i in range(6):
        a.remember(("round", i))
    assert a.memory == (("round", 4), ("round", 5))
    assert repr(a) == "Short(1)"


def test_agents_do_not_share_memory():
    a, b = Agent(1), Agent(2)
    a.remember("x")
    assert b.memory == ()


def test_agent_memory_size_zero_keeps_nothing():
    class Forgetful(Agent):
        memory_size = 0

    a = Forgetful(1)
    for i in range(3):
        a.remember(i)
    assert a.memory == ()


# --- dummy backend ----------------------------------------------------------------------------------
def test_seeded_value_deterministic_and_in_range():
    for max_value in (0, 1, 10, 100, 1000):
        vals = [seeded_value(5, r, k, max_value) for r in (1, 2) for k in range(500)]
        assert vals == [seeded_value(5, r, k, max_value) for r in (1, 2) for k in range(500)]
        assert all(isinstance(v, int) and 0 <= v <= max_value for v in vals)
    assert {seeded_value(0, 1, k, 0) for k in range(50)} == {0}


def test_seeded_value_depends_on_seed_round_and_key():
    base = [seeded_value(1, 1, k, 100) for k in range(200)]
    assert base != [seeded_value(2, 1, k, 100) for k in range(200)]
    assert base != [seeded_value(1, 2, k, 100) for k in range(200)]
    assert len(set(base)) > 50  # spread over the range, not constant
    # roughly uniform: both ends of the range occur over many keys
    many = [seeded_value(3, 1, k, 100) for k in range(5000)]
    assert min(many) == 0 and max(many) == 100
    assert 40 < sum(many) / len(many) < 60


def batch(keys: list[int], round_: int = 1, seed: int = 4, max_value: float = 100) -> InferBatch:
    return InferBatch(batch_id="b", run_id="r1", round=round_, model=ModelConfig(latency_s=0, seed=seed),
                      max_value=max_value, system="sys", keys=keys, prompts=[f"p{k}" for k in keys])


async def test_dummy_backend_complete():
    keys = list(range(0, 300, 3))
    texts = await DummyBackend().complete(batch(keys))
    assert len(texts) == len(keys)
    for k, t in zip(keys, texts):
        v = parse_guess(t, 100)
        assert v is not None
        assert v == seeded_value(4, 1, k, 100)


async def test_dummy_backend_independent_of_batching():
    keys = list(range(40))
    whole = await DummyBackend().complete(batch(keys, round_=2))
    parts = await DummyBackend().complete(batch(keys[:13], round_=2)) + \
        await DummyBackend().complete(batch(keys[13:], round_=2))
    assert whole == parts
    reordered = await DummyBackend().complete(batch(keys[::-1], round_=2))
    assert reordered == whole[::-1]


async def test_dummy_backend_respects_max_value():
    texts = await DummyBackend().complete(batch(list(range(200)), max_value=10))
    assert all(parse_guess(t, 10) is not None for t in texts)
    reply, calls = await DummyBackend().serve(batch(list(range(5)), max_value=10))
    assert reply.texts == texts[:5] and reply.error is None
    assert calls is None  # no LLM call happened, so nothing goes to llm_calls
