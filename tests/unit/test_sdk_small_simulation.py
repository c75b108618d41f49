"""A small Simulation (issue 40, item 3): each type declared once and read from where it is
written (the environment's generic, the agent's turn and act, decide), the default merge of a
partial of whole numbers, and the answer mode as the platform's `model.answer`, with the old
spellings (class attributes, a simulation's own chain of thought) still taken as they were."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import ValidationError

from populace.core.contracts import COT_MAX_TOKENS, ConfigRef, ModelConfig, RunConfig, config_json
from populace.sdk import LLM, Agent, Env, Observation, Outcome, Params, Partial, Simulation, State, Summary
from populace.sdk.answers import COT_INSTRUCTION, structured, with_reasoning
from populace.sdk.registry import resolve

if TYPE_CHECKING:
    from populace.sdk.world import World


class Seen(Observation):
    last: int | None = None


class Said(Outcome):
    n: int | None = None


class Spoke(Outcome):
    words: str = ""


class Counts(Partial):
    n: int = 0
    total: int = 0


class Kept(State):
    last: int | None = None


class Row(Summary):
    mean: float | None = None


class Speaker(Agent):
    async def turn(self, obs: Seen, llm: LLM) -> Said:
        return Said(n=1, raw="1", valid=True)


class Actor(Speaker):
    async def act(self, phase: str, view: Any, llm: LLM) -> Spoke:
        return Spoke(words="hi")


class Small(Env[Kept, Counts]):
    def reduce(self, agent_ids: Sequence[int], outcomes: Sequence[Said]) -> Counts:
        ns = [o.n for o in outcomes if o.valid and o.n is not None]
        return Counts(n=len(ns), total=sum(ns))

    def decide(self, state: Kept, round: int, total: Counts) -> tuple[Kept, Row]:
        return Kept(last=total.total), Row(mean=total.total / total.n if total.n else None)


class SmallSim(Simulation):
    name = "small-sim"
    Agent = Speaker
    Env = Small

    def answer_schema(self) -> dict:
        return structured({"n": {"type": "integer"}})


def test_each_type_is_read_from_where_it_is_written():
    assert (Small.State, Small.Partial) == (Kept, Counts)
    assert (SmallSim.Outcome, SmallSim.Observation, SmallSim.Summary, SmallSim.Act) == (Said, Seen, Row, None)
    SmallSim.check()
    tables = SmallSim.tables()
    assert [c.name for c in tables.outcome_columns] == ["n"] and tables.measure == "n"
    assert [c.name for c in tables.summary_columns] == ["mean"]


class Other(Outcome):
    n: int | None = None
    extra: str = ""


class Spelled(Env[Kept, Counts]):
    State = Kept  # the old spelling: said twice, still taken
    Partial = Counts


class ByHand(SmallSim):
    name = "by-hand"
    Outcome = Other  # set by hand: wins over the turn's annotation


class Child(ByHand):
    name = "child"  # inherits its parent's hand-set Outcome, not the annotation's


class WithActs(SmallSim):
    name = "with-acts"
    Agent = Actor


def test_what_is_set_by_hand_wins_and_is_inherited():
    assert (Spelled.State, Spelled.Partial) == (Kept, Counts)
    assert ByHand.Outcome is Other and Child.Outcome is Other
    assert ByHand.Observation is Seen  # what was not set by hand is still read
    assert WithActs.Act is Spoke


class Hidden(Agent):
    # an annotation only a type checker can read: nothing is inferred, nothing breaks
    async def turn(self, obs: World, llm: LLM) -> Said:  # type: ignore[override]
        return Said()


class Unannotated(Agent):
    async def turn(self, obs, llm):
        return Said()


class HiddenSim(Simulation):
    name = "hidden"
    Agent = Hidden
    Env = Small


class UnannotatedSim(Simulation):
    name = "unannotated"
    Agent = Unannotated
    Env = Small


def test_a_type_that_cannot_be_read_leaves_the_default_as_before():
    assert HiddenSim.Observation is Observation and HiddenSim.Outcome is Said  # the one it could read
    assert (UnannotatedSim.Outcome, UnannotatedSim.Observation) == (Outcome, Observation)
    assert UnannotatedSim.Summary is Row


def test_the_default_merge_adds_whole_numbers_in_any_order():
    env = Small(SmallSim(Params(), agents=3))
    parts = [Counts(n=1, total=4), Counts(n=2, total=-1), Counts(n=0, total=7)]
    assert env.merge(parts) == env.merge(parts[::-1]) == Counts(n=3, total=10)
    assert env.merge([]) == Counts()


class Mean(Partial):
    n: int = 0
    mean: float = 0.0


class FloatEnv(Env[Kept, Mean]):
    def reduce(self, agent_ids, outcomes):
        return Mean()


def test_a_partial_with_other_fields_is_told_to_write_its_merge():
    env = FloatEnv(SmallSim(Params(), agents=1))
    with pytest.raises(NotImplementedError, match="FloatEnv.merge: .* Mean has others"):
        env.merge([Mean()])


# -- the answer mode: the platform's `model.answer` ----------------------------------------------
def test_direct_is_left_out_of_a_configs_bytes_so_digests_stay():
    assert "answer" not in config_json(RunConfig()).decode()
    assert "answer" not in ModelConfig().model_dump() and "answer" not in ModelConfig(answer="direct").model_dump()
    cot = RunConfig.model_validate({"model": {"answer": "cot"}})
    assert '"answer":"cot"' in config_json(cot).decode()
    again = RunConfig.model_validate_json(config_json(cot))
    assert again.model.answer == "cot" and ConfigRef.of(again) == ConfigRef.of(cot)
    assert RunConfig.model_validate_json(config_json(RunConfig())).model.answer == "direct"


@pytest.mark.parametrize("value", ["chain", "COT", True, 1])
def test_a_bad_answer_mode_names_the_field(value):
    with pytest.raises(ValidationError) as err:
        RunConfig.model_validate({"model": {"answer": value}})
    assert [".".join(map(str, e["loc"])) for e in err.value.errors()] == ["model.answer"]


def config(**model) -> RunConfig:
    return RunConfig.model_validate({"simulation": "small-sim", "agents": 4, "model": model})


def test_cot_puts_reasoning_first_says_so_and_asks_for_room_to_think():
    direct = resolve(config(), SmallSim)
    cot = resolve(config(answer="cot"), SmallSim)
    told = resolve(config(answer="cot", max_tokens=60), SmallSim)
    assert direct.config.model.max_tokens == ModelConfig().max_tokens
    assert cot.config.model.max_tokens == COT_MAX_TOKENS and told.config.model.max_tokens == 60
    plain, thinking = direct.instance(), cot.instance()
    assert plain.request_schema() == plain.answer_schema() == structured({"n": {"type": "integer"}})
    assert thinking.request_schema() == {"type": "object", "required": ["reasoning", "n"],
                                         "properties": {"reasoning": {"type": "string"}, "n": {"type": "integer"}}}
    assert plain.request_system_prompt() == "" and thinking.request_system_prompt() == COT_INSTRUCTION
    assert resolve(cot.config, SmallSim).config == cot.config  # resolved once: taken as it is


class Budgeted(SmallSim):
    name = "budgeted"

    def system_prompt(self) -> str:
        return "Count."

    @classmethod
    def model_defaults(cls, params: Params) -> dict:
        return {"max_tokens": 99}


class Roomy(Budgeted):
    name = "roomy"

    @classmethod
    def model_defaults(cls, params: Params) -> dict:
        return {"max_tokens": 400, "temperature": 0.2}


def test_thinking_gets_the_larger_of_the_simulations_budget_and_the_platforms():
    resolved = resolve(config(answer="cot"), Budgeted)
    assert resolved.config.model.max_tokens == COT_MAX_TOKENS  # 99 was meant for a direct answer
    assert resolve(config(), Budgeted).config.model.max_tokens == 99
    roomy = resolve(config(answer="cot"), Roomy).config.model
    assert (roomy.max_tokens, roomy.temperature) == (400, 0.2)
    assert resolve(config(answer="cot", max_tokens=30), Roomy).config.model.max_tokens == 30  # the scenario's
    assert resolved.instance().request_system_prompt() == f"Count. {COT_INSTRUCTION}"


class OwnReasoning(SmallSim):
    """The old spelling: a simulation that writes its own chain of thought."""

    name = "own-reasoning"

    def system_prompt(self) -> str:
        return "Think, then count." if self.answer_mode == "cot" else "Count."

    def answer_schema(self) -> dict:
        return structured({"n": {"type": "integer"}}, reasoning=True)


def test_a_simulation_that_reasons_itself_is_taken_as_it_is():
    sim = resolve(config(answer="cot"), OwnReasoning).instance()
    assert sim.request_schema() == sim.answer_schema()
    assert sim.request_system_prompt() == "Think, then count."


class FreeText(SmallSim):
    name = "free-text"

    def answer_schema(self) -> None:
        return None


def test_cot_without_an_object_schema_is_refused_naming_the_field():
    resolve(config(), FreeText)  # direct: fine
    with pytest.raises(ValidationError, match=r"model\.answer: chain of thought .* None, not an object"):
        resolve(config(answer="cot"), FreeText)
    with pytest.raises(ValueError, match=r"model\.answer: .*\{\"type\": \"string\"\}"):
        with_reasoning({"type": "string"})


class ReadsMode(SmallSim):
    name = "reads-mode"

    def __init__(self, params: Params, **kw: Any) -> None:
        super().__init__(params, **kw)
        self.seen_mode = self.answer_mode  # an author's __init__ sees the run's mode


class StrictInit(SmallSim):
    """An __init__ written against last month's SDK, naming every keyword it takes."""

    name = "strict-init"

    def __init__(self, params: Params, *, agents: int, rounds: int = 1, seed: int = 0, run_id: str = "",
                 cast: Any = None) -> None:
        super().__init__(params, agents=agents, rounds=rounds, seed=seed, run_id=run_id, cast=cast)


def test_the_run_sets_the_mode_before_the_simulations_own_init():
    assert resolve(config(answer="cot"), ReadsMode).instance().seen_mode == "cot"
    assert resolve(config(), ReadsMode).instance().seen_mode == "direct"
    assert ReadsMode(Params(), agents=1).seen_mode == "direct"  # built by hand: direct
    assert resolve(config(answer="cot"), StrictInit).instance("r1").answer_mode == "cot"


def test_a_built_in_that_never_heard_of_the_section_thinks_on_it():
    """public-goods writes its own chain of thought (`prompt.answer`); `model.answer: cot` gives
    its direct prompts the platform's, and the dummy model's answers still parse."""
    import asyncio

    from populace.sdk.local import run_local

    cfg = RunConfig.model_validate({"simulation": "public-goods", "agents": 8, "rounds": 2,
                                    "model": {"answer": "cot", "latency_s": 0}})
    resolved = resolve(cfg)
    schema = resolved.instance().request_schema()
    assert list(schema["properties"]) == ["reasoning", "contribution"]
    assert resolved.config.model.max_tokens == COT_MAX_TOKENS
    result = asyncio.run(run_local(cfg))
    assert result.rounds["n_valid"] == [8, 8]
    own = resolve(RunConfig.model_validate({"simulation": "public-goods", "model": {"answer": "cot"},
                                            "prompt": {"answer": "cot"}})).instance()
    assert own.request_schema() == own.answer_schema()  # its own reasoning: nothing added
    assert COT_INSTRUCTION not in own.request_system_prompt()


class Shared(Observation):
    note: str = ""


class Mine(Observation):
    cell: int  # a view's own field, required: never the round's shared observation


class Viewer(Agent):
    async def turn(self, obs: Mine, llm: LLM) -> Said:
        return Said()


class ViewEnv(Small):
    def view(self, world: Any, round: int, agent_id: int) -> Mine:
        return Mine(round=round, cell=agent_id)


class ObservingEnv(ViewEnv):
    def observe(self, state: Kept, round: int) -> Shared:
        return Shared(round=round)


class ViewSim(Simulation):
    name = "view-sim"
    Agent = Viewer
    Env = ViewEnv


class ObservingSim(ViewSim):
    name = "observing-sim"
    Env = ObservingEnv


def test_with_views_the_observation_is_what_observe_returns_never_the_turns_view():
    assert ViewSim.Observation is Observation  # the view's type is not the round's observation
    assert ObservingSim.Observation is Shared
    assert ObservingSim.Outcome is Said


class Louder(Outcome):
    n: int | None = None
    loud: bool = False


class Shouter(Agent):
    async def turn(self, obs: Seen, llm: LLM) -> Louder:
        return Louder()


class ShoutingSim(SmallSim):
    name = "shouting-sim"
    Agent = Shouter  # another agent: its own outcome is read, not the parent's


class ShoutingByHand(ByHand):
    name = "shouting-by-hand"
    Agent = Shouter  # the parent set Outcome by hand: that stays


def test_a_subclass_with_another_agent_reads_its_own_types_unless_a_parent_set_them_by_hand():
    assert ShoutingSim.Outcome is Louder and SmallSim.Outcome is Said
    assert ShoutingByHand.Outcome is Other
    assert ShoutingSim._types_read >= {"Outcome", "Observation", "Summary"}
