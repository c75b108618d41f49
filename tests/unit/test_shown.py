"""Who saw what (populace.sdk.shown) and list columns: what a view `show`s is checked when it is
made and against the round's world when its agent's outcome leaves; a simulation that declares
`shown_items` wrongly does not load; `list[int]` (and `Ids`) fields are LIST columns whose values
are checked like any other column's."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

from populace.core.contracts import RunConfig
from populace.sdk import Env, Outcome, Simulation
from populace.sdk.local import run_local
from populace.sdk.outcome import MAX_IDS, Ids, column_type
from populace.sdk.play import OutcomeSink
from populace.sdk.registry import resolve
from populace.sdk.shown import MAX_SHOWN, ShownBook, ShownError, checked
from populace.sdk.simulation import SimulationError
from populace.sdk.world import World, column

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e" / "sims"))
from bad_input_sims import BoardEnv, Ledger


def test_a_record_is_whole_numbers_each_once_with_a_rank_each():
    assert checked((4, 9, 2)) == ([4, 9, 2], [1, 2, 3])  # ranks: the order shown
    assert checked(np.array([4, 9], dtype=np.int32), ranks=[2, 1]) == ([4, 9], [2, 1])
    assert checked([np.int64(4)], ranks=(np.int16(3),)) == ([4], [3])
    assert checked([]) == ([], [])
    for items, ranks, why in [
        ([1, 1], None, r"shown\.items: item 1 is shown twice"),
        ([1, True], None, r"shown\.items\[1\]: True is not a whole number"),
        ([1, 2.0], None, r"shown\.items\[1\]: 2\.0 is not a whole number"),
        ("12", None, r"shown\.items: a list of ids, not str"),
        (7, None, r"shown\.items: a list of ids, not int"),
        (np.array([1.5]), None, r"shown\.items: a 1-D array of whole numbers"),
        ([1, 2], [1], r"shown\.ranks: 1 ranks for 2 items"),
        ([1, 2], [0, 1], r"shown\.ranks: rank 0 \(ranks count from 1"),
        (list(range(MAX_SHOWN + 1)), None, r"shown\.items: 1,001 items, more than a record holds"),
    ]:
        with pytest.raises(ShownError, match=why):
            checked(items, ranks)


def test_the_book_hands_each_batch_its_agents_records_and_checks_them_against_the_world():
    book = ShownBook("feed", 3, "Pool.post_id", np.array([10, 11, 12, 40], dtype=np.int64))
    book.viewing = 5
    with pytest.raises(ShownError, match=r"show\(6, …\) in the view of agent 5"):
        book.add(6, [10])
    book.add(5, [10, 11])
    book.add(5, [12, 40], ranks=[1, 3])  # the view made again: the last record counts
    book.viewing = None
    book.add(2, [])
    book.add(9, [40])
    assert book.take([1, 9, 5]) == {"agent_id": [9, 5], "items": [[40], [12, 40]], "ranks": [[1], [1, 3]]}
    assert book.take([9, 5]) is None  # taken once
    book.add(3, [10])
    book.add(4, [11, 13])
    with pytest.raises(ShownError, match=r"simulation 'feed', round 3, agent 4: shown\.items: 13 is not in the "
                                         r"round's Pool\.post_id"):
        book.take([2, 3, 4])


def test_show_outside_a_round_is_kept_for_a_test_and_needs_shown_items():
    env = BoardEnv.__new__(BoardEnv)
    env.show(7, [101, 102], ranks=[2, 1])
    assert env.last_shown == (7, [101, 102], [2, 1])

    class Plain(Env):
        pass

    with pytest.raises(ShownError, match=r"Plain\.show: declare `shown_items`"):
        Plain.__new__(Plain).show(1, [1])


def _declaring(**env_attrs) -> type[Simulation]:
    class Items(World):
        post_id = column("int64", "posts")
        score = column("float64", "posts")

    env = type("ItemsEnv", (BoardEnv,), {"World": Items, **env_attrs})
    return type("Declared", (Ledger,), {"Env": env, "name": "declared"})


@pytest.mark.parametrize("attrs,why", [
    ({"shown_items": "posts"}, r"'posts' is not a column of Items \(post_id, score\)"),
    ({"shown_items": "score"}, r"Items\.score is float64; the items a view shows are ids"),
    ({"shown_items": "Post-Id"}, r"must name a column of its World"),
    ({"shown_items": "post_id", "World": None}, r"the environment declares no World"),
    ({"shown_items": "post_id", "view": Env.view}, r"the environment has no `view`"),
])
def test_a_simulation_declaring_shown_items_wrongly_does_not_load(attrs, why):
    with pytest.raises(SimulationError, match=why):
        _declaring(**attrs).check()
    assert _declaring(shown_items="post_id").tables().shown_items == "post_id"


def test_a_local_run_records_what_each_acting_agent_was_shown():
    resolved = resolve(RunConfig(simulation="bad_input_sims:Ledger", agents=20, rounds=2, seed=3), Ledger)
    out = asyncio.run(run_local(resolved, hosts=3))
    assert out.tables.shown_items == "cells"
    assert out.shown["agent_id"] == out.outcomes["agent_id"] and out.shown["round"] == out.outcomes["round"]
    assert out.shown["items"][:2] == [[101, 103], [102, 104]] and out.shown["ranks"][0] == [2, 1]


# -- list columns ---------------------------------------------------------------------------------
def test_a_list_of_one_scalar_type_is_a_list_column_anything_else_json():
    assert [column_type(t) for t in (list[int], list[int] | None, Ids, Ids | None, list[float], list[str],
                                     list[bool])] == ["BIGINT[]"] * 4 + ["DOUBLE[]", "VARCHAR[]", "BOOLEAN[]"]
    assert [column_type(t) for t in (list, list[dict], list[int | None], dict[str, int], list[list[int]])] == \
        ["JSON"] * 5


class Picked(Outcome):
    seen: Ids | None = None
    scores: list[float] | None = None


class _Env(Env):
    def reduce(self, ids, outs):
        return None


def test_an_ids_value_that_does_not_fit_is_reset_and_the_row_marked_invalid_naming_it():
    sim = type("S", (Simulation,), {"name": "s", "Outcome": Picked, "Env": _Env})
    rows = []
    sink = OutcomeSink(sim, _Env.__new__(_Env), emit=rows.append)
    sink.add(0, Picked(seen=[3, 4], scores=[0.5]), 1.0)
    sink.add(1, Picked(seen=[3, -1]), 1.0)
    sink.add(2, Picked(seen=list(range(MAX_IDS + 1))), 1.0)
    sink.add(3, Picked(scores=[float("nan")]), 1.0)
    sink.flush()
    (batch,) = rows
    assert batch.columns["seen"] == [[3, 4], None, None, None] and batch.columns["scores"] == [[0.5], None, None, None]
    assert batch.valid == [True, False, False, False]
    assert "outcome.seen: Input should be greater than or equal to 0" in batch.errors[1]
    assert "outcome.seen: List should have at most 10000 items" in batch.errors[2]
    assert "outcome.scores" in batch.errors[3]
