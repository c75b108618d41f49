"""An answer outside the declared options is the model's invalid answer (issue 37, item 5),
wherever the options come from: a `Literal` column, `measure_options`, or only the answer
schema's `enum` (a stranger's go/stay measure recorded 60 of 600 "maybe" answers valid). It is
counted as the model's in the round's share, the recorded rows, `results` and the report's usage,
never as the simulation's error, and the recorder's tables carry the options."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Literal

import duckdb
import pytest

from populace.analysis.queries import round_table, run_usage
from populace.core.contracts import RunConfig
from populace.sdk import LLM, Agent, Env, Outcome, Partial, ScriptedLLM, Simulation, State, Summary
from populace.sdk.answers import answer_field, schema_options
from populace.sdk.local import run_local
from populace.sdk.play import declared_options
from populace.sdk.registry import resolve
from populace.store.local_runs import record_local


class Step(Outcome):
    measure = "move"
    move: str | None = None  # a plain text column: its options live only in the answer schema
    mood: str | None = None  # another answered field with an enum of its own
    level: int | None = None  # an integer answer with an enum


class Walker(Agent):
    __slots__ = ()

    async def turn(self, obs, llm: LLM) -> Step:
        raw = await llm.ask("go or stay?", key=self.id)
        # the parser a stranger wrote: it lets any text through as valid
        return Step(move=answer_field(raw, "move"), mood=answer_field(raw, "mood"),
                    level=answer_field(raw, "level"), raw=raw, valid=True)


class Count(Partial):
    n: int = 0


class Walked(Summary):
    moves: int = 0


class WalkEnv(Env[State, Count]):
    Partial = Count

    def reduce(self, agent_ids: Sequence[int], outcomes) -> Count:
        return Count(n=sum(1 for o in outcomes if o.valid))

    def merge(self, partials) -> Count:
        return Count(n=sum(p.n for p in partials))

    def decide(self, state, round, total):
        return state, Walked(moves=total.n)


class GoStay(Simulation):
    name = "go-stay"
    Agent = Walker
    Env = WalkEnv
    Outcome = Step
    Summary = Walked

    def answer_schema(self) -> dict:
        return {"type": "object", "required": ["move", "mood", "level"],
                "properties": {"move": {"type": "string", "enum": ["go", "stay"]},
                               "mood": {"type": "string", "enum": ["calm", "eager"]},
                               "level": {"type": "integer", "enum": [1, 2, 3]}}}


def answer(key: int, _prompt: str) -> str:
    """Every 10th agent answers "maybe"; every 7th a mood outside its options; every 11th level 9."""
    move = "maybe" if key % 10 == 0 else ("go", "stay")[key % 2]
    mood = "sulky" if key % 7 == 3 else "calm"
    level = 9 if key % 11 == 5 else 1 + key % 3
    return f'{{"move": "{move}", "mood": "{mood}", "level": {level}}}'


def test_the_schema_gives_each_answered_field_its_options_in_order():
    assert schema_options(GoStay(None, agents=1).answer_schema()) == {
        "move": ("go", "stay"), "mood": ("calm", "eager"), "level": (1, 2, 3)}
    assert schema_options({"enum": ["b", "a", "b"]}) == {"": ("b", "a")}
    assert schema_options({"type": "object", "properties": {"x": {"type": "number"}}}) == {}
    assert schema_options(None) == {} and schema_options({"properties": {"x": {"enum": []}}}) == {}


def test_options_that_live_only_in_the_answer_schema_are_the_measures_declared_options():
    config = RunConfig.model_validate({"simulation": "go-stay", "agents": 4})
    tables = resolve(config, GoStay).tables()
    assert tables.measure == "move" and tables.measure_options == ["go", "stay"]  # the recorder refuses others
    # a column whose type cannot hold its property's enum is the simulation's translation: left alone
    assert declared_options(GoStay, "move", ["go", "stay"], {"properties": {"level": {"enum": ["low", "high"]}}}) \
        == {"move": ("go", "stay")}
    assert declared_options(GoStay, "move", None, GoStay(None, agents=1).answer_schema()) == {
        "mood": ("calm", "eager"), "level": (1, 2, 3), "move": ("go", "stay")}


def test_declared_options_win_over_the_schema_and_a_literal_is_checked_by_its_type():
    class Declared(GoStay):
        name = "go-stay-declared"

        @classmethod
        def measure_options(cls, params):
            return ("stay", "go", "wait")

    assert Declared.tables_for(Declared.Params(), Declared(None, agents=1).answer_schema()).measure_options \
        == ["stay", "go", "wait"]


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    config = RunConfig.model_validate({"simulation": "go-stay", "agents": 600, "rounds": 1})
    resolved = resolve(config, GoStay)
    result = asyncio.run(run_local(resolved, llm=lambda run, round_: ScriptedLLM(answer), hosts=2))
    db = str(tmp_path_factory.mktemp("options") / "options.duckdb")
    record_local(db, run_id="opts", config=resolved.config, tables=result.tables, outcomes=result.outcomes,
                 rounds=result.rounds)
    return result, db


def test_an_answer_outside_the_schemas_enum_is_the_models_invalid_answer_with_its_text(played):
    result, _ = played
    rows = {a: (m, md, lv, ok, raw, err) for a, m, md, lv, ok, raw, err in zip(
        result.outcomes["agent_id"], result.outcomes["move"], result.outcomes["mood"], result.outcomes["level"],
        result.outcomes["valid"], result.outcomes["raw"], result.outcomes["error"], strict=True)}
    assert rows[20] == (None, "calm", 3, False, answer(20, ""),
                        "answer: outcome.move: 'maybe' is not one of the options ('go', 'stay')")
    assert rows[3][1] is None and rows[3][3] is False  # mood "sulky": its column back to its default
    assert rows[3][5] == "answer: outcome.mood: 'sulky' is not one of the options ('calm', 'eager')"
    assert rows[5][2] is None and rows[5][5] == "answer: outcome.level: 9 is not one of the options (1, 2, 3)"
    assert rows[1] == ("stay", "calm", 2, True, answer(1, ""), None)
    bad = {a for a in range(600) if a % 10 == 0 or a % 7 == 3 or a % 11 == 5}
    assert {a for a, r in rows.items() if not r[3]} == bad
    assert all(r[5].startswith("answer: ") for a, r in rows.items() if a in bad)
    assert result.rounds["n_valid"] == [600 - len(bad)] and result.rounds["moves"] == [600 - len(bad)]


def test_every_table_counts_them_as_the_models_invalid_answers_never_the_simulations_errors(played):
    _, db = played
    bad = sum(1 for a in range(600) if a % 10 == 0 or a % 7 == 3 or a % 11 == 5)
    with duckdb.connect(db, read_only=True) as con:
        [row] = round_table(con, "opts")
        usage = run_usage(con, "opts")
        recorded = con.execute("SELECT count(*) FILTER (WHERE valid AND move NOT IN ('go', 'stay')), "
                               "count(*) FILTER (WHERE NOT valid) FROM go_stay_outcomes").fetchone()
    assert (row["n"], row["n_valid"], row["n_invalid_answers"], row["n_simulation_errors"]) == (600, 600 - bad, bad, 0)
    assert list(row["options"]) == ["go", "stay"]  # the schema's order, and no "maybe"
    assert (usage["invalid_answers"], usage["simulation_errors"]) == (bad, 0)
    assert recorded == (0, bad)


def test_a_literal_column_outside_its_values_is_the_models_invalid_answer_too():
    class Move(Outcome):
        move: Literal["go", "stay"] | None = None

    class LiteralWalker(Agent):
        __slots__ = ()

        async def turn(self, obs, llm):
            raw = await llm.ask("?", key=self.id)
            return Move(move=answer_field(raw, "move"), raw=raw)

    class LiteralGoStay(GoStay):
        name = "go-stay-literal"
        Agent = LiteralWalker
        Outcome = Move

    config = RunConfig.model_validate({"simulation": "go-stay-literal", "agents": 3, "rounds": 1})
    out = asyncio.run(run_local(resolve(config, LiteralGoStay),
                                llm=lambda run, r: ScriptedLLM({0: '{"move": "go"}', 1: '{"move": "maybe"}',
                                                                2: '{"move": 3}'}))).outcomes
    assert out["valid"] == [True, False, False]
    assert out["error"][1].startswith("answer: outcome.move: Input should be 'go' or 'stay'")
    assert out["error"][2].startswith("answer: outcome.move: Input should be 'go' or 'stay'")
