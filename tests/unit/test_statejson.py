"""State that comes back from JSON as it went in (populace.sdk.statejson, issue 37 item 6): what a
checkpoint, the environment's state and the wire keep exactly, what they refuse naming the field,
and what the SDK refuses when a package is checked."""

from __future__ import annotations

import json
import random
from collections import deque
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from pydantic_core import from_json, to_json

from populace.sdk import Agent, Env, Outcome, Partial, Simulation, SimulationError, State
from populace.sdk.env import Ints
from populace.sdk.statejson import (
    DEEP_MEMORY,
    MARK,
    StateTypeError,
    decode,
    decode_state,
    encode,
    encode_column,
    from_wire,
    loose_fields,
    to_wire,
    unkept,
)

KEPT = [
    (1, (2, 3)), frozenset({1, 2}), {3, 1}, {1: "x", (1, 2): {3}}, deque([1, 2], maxlen=3), Fraction(1, 3),
    [1, [2, (3,)]], {MARK: 1}, {"a": [1, 2]}, ((), (((),),)), float("inf"), None, True, "text", 10**30,
]


@pytest.mark.parametrize("value", KEPT, ids=repr)
def test_a_value_comes_back_from_json_as_it_went_in(value):
    back = decode(from_json(to_json(encode(value))))
    assert back == value and type(back) is type(value)
    if isinstance(value, deque):
        assert back.maxlen == value.maxlen


def test_plain_values_are_written_as_they_are_and_a_plain_column_is_not_copied():
    assert encode({"a": [1, 2.5, None]}) == {"a": [1, 2.5, None]}
    column = [1, 2.5, "x", None, True]
    assert encode_column("score", column) is column


def test_a_value_no_checkpoint_can_rebuild_is_refused_naming_the_field_and_agent():
    with pytest.raises(StateTypeError, match=r"Agent\.rng: agent 7's value: a random\.Random"):
        encode_column("rng", [1, random.Random(1)], lambda i: 6 + i, Agent)


def test_a_typed_form_no_encoder_writes_is_refused_not_run():
    for forged in (["module", "os.system"], ["dict", [[[1], 2]]], ["fraction", "x/y"], [], ["tuple"]):
        with pytest.raises(StateTypeError):
            decode({MARK: forged})


def test_a_memory_keeps_its_one_level_rule_until_an_item_is_deeper():
    class Shallow(Agent):
        __slots__ = ()

    memories = [((1, "go"), (2, "stay")), ((1, None),)]
    assert encode_column("memory", memories, owner=Shallow) is memories  # never walked
    state = decode_state(json.loads(json.dumps({"memory": memories[0]})), Shallow)
    assert state["memory"] == memories[0]

    class Deep(Agent):
        __slots__ = ()

    deep = Deep(0)
    deep.remember((1, ("go", 2)))
    assert Deep in DEEP_MEMORY
    back = decode_state(from_json(to_json({"memory": encode_column("memory", [deep.memory], owner=Deep)[0]})), Deep)
    assert back["memory"] == ((1, ("go", 2)),) and type(back["memory"][0][1]) is tuple


class Loose(State):
    last: Any = None
    history: list = []
    typed: tuple[int, int] = (0, 0)
    counts: dict[str, Any] = {}


class Columns(Partial):
    ids: Ints = np.zeros(0, dtype=np.int64)
    pairs: list = []


def test_a_models_loose_fields_are_those_its_types_do_not_pin():
    assert loose_fields(Loose) == {"last", "history", "counts"}
    assert loose_fields(Columns) == {"pairs"}


def test_a_state_with_tuples_in_loose_fields_comes_back_exactly_and_the_wire_is_json():
    state = Loose(last=(3, 4.5), history=[(1, 2), (2, 3)], typed=(1, 2), counts={"a": frozenset({1})})
    wire = to_wire(state)
    back = from_wire(Loose, json.loads(json.dumps(wire)))
    assert back == state and type(back.last) is tuple and type(back.history[0]) is tuple
    assert wire["typed"] == [1, 2]  # a typed field is pydantic's, as it always was
    plain = Loose(last=1, history=[1, 2])
    assert to_wire(plain) == plain.model_dump(mode="json")  # nothing typed: the same JSON as before


def test_a_state_holding_what_no_checkpoint_keeps_is_refused_and_an_observation_travels_as_before():
    with pytest.raises(StateTypeError, match=r"Loose\.last: a random\.Random .* declare the field's type"):
        to_wire(Loose(last=random.Random(1)))
    from datetime import date

    assert to_wire(Loose(last=date(2026, 1, 2)), strict=False)["last"] == "2026-01-02"


def test_what_an_annotation_names_a_checkpoint_cannot_keep():
    assert unkept(random.Random) is random.Random
    assert unkept(dict[str, list[random.Random]]) is random.Random
    for ok in (tuple[int, ...], frozenset[str], dict[tuple[int, int], float] | None, deque, Fraction, Any, list):
        assert unkept(ok) is None


class Walker(Agent):
    __slots__ = ()

    async def turn(self, obs, llm):
        return Outcome()


class WalkEnv(Env):
    def reduce(self, agent_ids, outcomes):
        return Partial()

    def merge(self, partials):
        return Partial()

    def decide(self, state, round, total):
        from populace.sdk import Summary

        return state, Summary()


class Step(Outcome):
    moved: int | None = None


class Walkers(Simulation):
    name = "walkers"
    Agent = Walker
    Env = WalkEnv
    Outcome = Step


def test_a_package_declaring_a_state_field_of_a_type_no_checkpoint_keeps_is_refused_when_checked():
    Walkers.check()

    class Rolling(Walker):
        __slots__ = ("rng",)
        state_fields = ("rng",)
        rng: random.Random

    class Rolls(Walkers):
        name = "rolls"
        Agent = Rolling

    with pytest.raises(SimulationError, match=r"`Rolling\.rng` is declared Random, and a checkpoint cannot keep a Random"):
        Rolls.check()


def test_an_outcome_column_of_a_type_no_table_holds_is_refused_naming_the_field():
    class Pair(Outcome):
        pair: tuple[int, int] | None = None

    class Pairs(Walkers):
        name = "pairs"
        Outcome = Pair

    with pytest.raises(SimulationError, match=r"Pair\.pair: .* is not a column type"):
        Pairs.check()

