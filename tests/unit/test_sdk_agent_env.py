"""The SDK's building blocks: triggers (Listeners), the Agent's memory and state, how a
simulation declares itself (and is refused when it declares wrongly), and loading by name."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from populace.core.contracts import RunConfig
from populace.sdk import Agent, Env, Listeners, Observation, Outcome, Params, Partial, Simulation, Summary
from populace.sdk.answers import answer_field
from populace.sdk.outcome import OutcomeError, column_type, outcome_fields
from populace.sdk.registry import load_simulation, resolve
from populace.sdk.simulation import SimulationError


# --- Listeners -----------------------------------------------------------------------------
async def test_emit_calls_sync_async_and_wildcard_listeners():
    env = Listeners()
    log: list = []

    def sync_fn(ev, p):
        log.append(("sync", ev, p))

    async def async_fn(ev, p):
        await asyncio.sleep(0)
        log.append(("async", ev, p))

    env.listen("tick", sync_fn)
    env.listen("tick", async_fn)
    env.listen("*", lambda ev, p: log.append(("star", ev, p)))
    env.listen("tock", lambda ev, p: log.append(("other", ev, p)))
    await env.emit("tick", 1)
    assert sorted(log) == [("async", "tick", 1), ("star", "tick", 1), ("sync", "tick", 1)]
    log.clear()
    await env.emit("tock", 2)
    assert sorted(log) == [("other", "tock", 2), ("star", "tock", 2)]
    log.clear()
    await env.emit("nobody", 3)
    assert log == [("star", "nobody", 3)]


async def test_async_listeners_run_concurrently():
    env = Listeners()
    ready = asyncio.Event()

    async def waiter(ev, p):
        await ready.wait()  # only finishes if `setter` runs while this one is waiting

    async def setter(ev, p):
        await asyncio.sleep(0)
        ready.set()

    env.listen("go", waiter)
    env.listen("go", setter)
    await asyncio.wait_for(env.emit("go", None), timeout=2)


async def test_unsubscribe_and_errors_propagate():
    env = Listeners()
    log: list = []
    off = env.listen("tick", lambda ev, p: log.append(p))
    off_star = env.listen("*", lambda ev, p: log.append(("*", p)))
    await env.emit("tick", 1)
    off()
    await env.emit("tick", 2)
    off_star()
    await env.emit("tick", 3)
    assert log == [1, ("*", 1), ("*", 2)]

    async def boom(ev, p):
        raise RuntimeError("listener failed")

    env.listen("x", boom)
    with pytest.raises(RuntimeError, match="listener failed"):
        await env.emit("x", None)


# --- Agent -------------------------------------------------------------------------------------
def test_agent_remember_keeps_last_memory_size_items():
    a = Agent(7)
    assert (a.id, a.persona, a.sim, a.memory) == (7, None, None, ())
    for i in range(12):
        a.remember(i)
        assert len(a.memory) == min(i + 1, Agent.memory_size)
    assert Agent.memory_size == 5 and a.memory == (7, 8, 9, 10, 11)


def test_agent_memory_size_can_be_overridden_and_is_not_shared():
    class Short(Agent):
        __slots__ = ()
        memory_size = 2

    class Forgetful(Agent):
        __slots__ = ()
        memory_size = 0

    a, b, f = Short(1), Short(2), Forgetful(3)
    for i in range(6):
        a.remember(("round", i))
        f.remember(i)
    assert a.memory == (("round", 4), ("round", 5)) and b.memory == () and f.memory == ()
    assert repr(a) == "Short(1)"


def test_agent_is_small_and_its_state_round_trips():
    a = Agent(1)
    assert not hasattr(a, "__dict__")  # slots only: a million of these fit in a host
    a.remember((1, 40.0))
    b = Agent(1)
    b.restore(a.state())
    assert b.memory == a.memory


# --- declaring a simulation ----------------------------------------------------------------------
class Choice(Outcome):
    option: str | None = None
    score: float | None = None


class Counted(Partial):
    n: int = 0


class Tally(Summary):
    leader: str | None = None


class Voter(Agent):
    __slots__ = ()

    async def turn(self, obs, llm):
        return Choice(option=await llm.ask("pick", key=self.id))


class Counter(Env):
    Partial = Counted

    def reduce(self, agent_ids, outcomes):
        return Counted(n=len(outcomes))

    def merge(self, partials):
        return Counted(n=sum(p.n for p in partials))

    def decide(self, state, round, total):
        return state, Tally()


class Knobs(Params):
    size: int = 3


class Good(Simulation):
    name = "good"
    Params = Knobs
    Agent = Voter
    Env = Counter
    Outcome = Choice
    Summary = Tally


def test_a_good_declaration_gives_its_tables():
    Good.check()
    t = Good.tables()
    assert (t.outcomes, t.rounds, t.grouped, t.measure, t.measure_kind) == (
        "good_outcomes", "good_rounds", False, "option", "categorical")
    assert [(c.name, c.type) for c in t.outcome_columns] == [("option", "VARCHAR"), ("score", "DOUBLE")]
    assert [(c.name, c.type) for c in t.summary_columns] == [("leader", "VARCHAR")]


@pytest.mark.parametrize("change,message", [
    ({"name": ""}, "`name` must be set"),
    ({"Agent": Agent}, "your Agent subclass"),
    ({"Env": Env}, "your Env subclass"),
    ({"Params": dict}, "`Params` must be a subclass"),
    ({"outcome_table": "runs"}, "must be a lower-case identifier and not one of"),
    ({"summary_table": "Bad-Name"}, "must be a lower-case identifier"),
    ({"summary_table": "good_outcomes"}, "must differ"),
    ({"grid_columns": ("cell", "option")}, r"`grid_columns` names 'cell', which is not a column of Choice"),
    ({"grid_columns": ("score", "option")}, r"the cell column 'score' must be a whole number \(int\), not DOUBLE"),
    ({"grid_columns": "cell"}, r"`grid_columns` must be \(cell column, colour column\)"),
])
def test_wrong_declarations_are_refused_with_the_reason(change, message):
    bad = type("Bad", (Good,), change)
    with pytest.raises(SimulationError, match=message):
        bad.check()


def test_outcome_fields_need_defaults_known_types_and_free_names():
    class NoDefault(Outcome):
        x: int

    class Reserved(Outcome):
        round: int = 0

    class Weird(Outcome):
        x: set | None = None

    with pytest.raises(OutcomeError, match="needs a default"):
        outcome_fields(NoDefault)
    with pytest.raises(OutcomeError, match="records that column itself"):
        outcome_fields(Reserved)
    with pytest.raises(OutcomeError, match="is not a column type"):
        column_type(outcome_fields(Weird)[0][1])
    assert [column_type(t) for t in (int, bool, str, float, dict, list[int], list, int | None)] == [
        "BIGINT", "BOOLEAN", "VARCHAR", "DOUBLE", "JSON", "BIGINT[]", "JSON", "BIGINT"]  # list[int]: a LIST


def test_outcomes_are_keyword_dataclasses_with_valid_and_raw():
    c = Choice(option="a", raw="{}")
    assert (c.valid, c.raw, c.option, c.score) == (True, "{}", "a", None)
    with pytest.raises(TypeError):
        Choice("a")  # keyword only: a field order change never shifts values


# --- loading and resolving -----------------------------------------------------------------------
def test_unknown_simulation_names_the_installed_ones():
    with pytest.raises(SimulationError, match=r"unknown simulation 'nope'; installed: .*ratio-game"):
        load_simulation("nope")


@pytest.mark.parametrize("path,message", [
    ("no_such_module_xyz:Sim", "cannot import: ModuleNotFoundError"),
    ("populace.sdk:NoSuchThing", "cannot import: AttributeError"),
    ("populace.sdk:Agent", "not a populace.sdk.Simulation subclass"),
])
def test_bad_import_paths_say_what_failed(path, message):
    with pytest.raises(SimulationError, match=message):
        load_simulation(path)


def test_import_path_and_entry_point_find_the_same_class():
    assert load_simulation("populace_ratio_game:RatioGame") is load_simulation("ratio-game")


def test_resolve_validates_the_simulations_sections():
    r = resolve(RunConfig(simulation=f"{__name__}:Good", size=4))
    assert r.params == Knobs(size=4) and r.config.params == {"size": 4}
    with pytest.raises(ValidationError) as exc:
        resolve(RunConfig(simulation=f"{__name__}:Good", size="big"))
    assert exc.value.errors()[0]["loc"] == ("size",)


def test_observations_are_frozen_and_carry_the_round():
    o = Observation(round=3)
    with pytest.raises(ValidationError):
        o.round = 4  # type: ignore[misc]


@pytest.mark.parametrize("text,value", [
    ('{"guess": 42}', 42), ('  {"reasoning": "hm", "guess": 4.5} ', 4.5), ('{"guess": "7"}', "7"),
    ('{"other": 1}', None), ("42", "42"), ("  yes ", "yes"), ("", None), ("   ", None),
    ('{"guess": 4', '{"guess": 4'),  # JSON that does not parse comes back as text: the caller refuses it
])
def test_answer_field_reads_a_structured_or_a_bare_answer(text, value):
    assert answer_field(text, "guess") == value
