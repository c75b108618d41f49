"""World rules as pure functions (issue 37): exclusive claims granted by a seeded rule that does not
depend on placement or arrival order, invariants and their witnesses, grid neighbourhoods with a
radius, line of sight and ranked cells, and the world-column selector."""

from __future__ import annotations

import random

import numpy as np
import pytest

import populace.sdk.claims as claims_module
from populace.sdk import Partial, invariant, select
from populace.sdk.claims import CLAIM_SALT, ClaimError, Claims
from populace.sdk.rules import InvariantError, check, declared, distinct, witness
from populace.sdk.select import SelectionError, takes, uniform
from populace.sdk.space import EMPTY, Grid, offsets
from populace.sdk.world import World, column


# -- claims ---------------------------------------------------------------------------------------
def one_by_one(c: Claims, seed: int, round_: int, holder: np.ndarray | None = None) -> list[tuple[int, int]]:
    """The documented rule, played out literally: the claimants in the seeded order, each taking its
    first target nobody before it took (a held target only by its holder)."""
    agents = sorted(set(c.agent.tolist()))
    draw = uniform(seed, round_, np.asarray(agents, dtype=np.int64), CLAIM_SALT)
    order = [a for _, a in sorted(zip(draw.tolist(), agents))]
    s = c.sorted()
    lists: dict[int, list[int]] = {}
    for a, t in zip(s.agent.tolist(), s.target.tolist()):
        if holder is None or holder[t] in (EMPTY, a):
            lists.setdefault(a, []).append(t)
    taken: dict[int, int] = {}
    for a in order:
        for t in lists.get(a, []):
            if t not in taken:
                taken[t] = a
                break
    return sorted((a, t) for t, a in taken.items())


@pytest.mark.parametrize("direct", [True, False], ids=["targets-indexed", "targets-compacted"])
def test_a_grant_is_serial_dictatorship_in_a_seeded_order_whatever_order_the_claims_came_in(direct, monkeypatch):
    if not direct:  # a huge grid: only the claimed targets are indexed
        monkeypatch.setattr(claims_module, "DIRECT_TARGETS", 4)
    rng = random.Random(7)
    for trial in range(200):
        n, size = rng.randint(0, 25), rng.randint(1, 12)
        ids = list(range(n))
        rng.shuffle(ids)
        c = Claims.ranked(ids, [[rng.randrange(size) for _ in range(rng.randint(0, 4))] for _ in ids])
        holder = None
        if trial % 2:
            holder = np.full(size, EMPTY)
            for a in rng.sample(range(max(n, 1)), min(n, size // 2)):
                holder[rng.randrange(size)] = a
        won = c.grant(size, seed=trial, round=2, holder=holder)
        assert sorted(zip(won.agent.tolist(), won.target.tolist())) == one_by_one(c, trial, 2, holder)
        assert won.agent.tolist() == sorted(won.agent.tolist()) and len(set(won.target.tolist())) == len(won)
        assert set(won.lost.tolist()) == set(c.agent.tolist()) - set(won.agent.tolist())
        shuffled = np.random.default_rng(trial).permutation(len(c))  # merged in another order: the same grant
        again = Claims(c.agent[shuffled], c.target[shuffled], c.rank[shuffled]).grant(size, seed=trial, round=2,
                                                                                       holder=holder)
        assert again == won


def test_a_contested_target_goes_to_the_claimant_drawn_first_and_the_loser_takes_its_next_choice():
    c = Claims.ranked([4, 9], [[0, 1], [0]])
    won = c.grant(3, seed=1, round=1, what="cell")
    first = 4 if uniform(1, 1, np.array([4]), CLAIM_SALT)[0] < uniform(1, 1, np.array([9]), CLAIM_SALT)[0] else 9
    if first == 4:
        assert (won.agent.tolist(), won.target.tolist(), won.lost.tolist()) == ([4], [0], [9])
    else:
        assert (won.agent.tolist(), won.target.tolist(), won.lost.tolist()) == ([4, 9], [1, 0], [])
    assert won.per_agent(10).tolist() == [EMPTY] * 4 + [won.per_agent(10)[4]] + [EMPTY] * 4 + [won.per_agent(10)[9]]
    other = c.grant(3, seed=1, round=2)  # drawn again each round
    assert isinstance(other.agent, np.ndarray)


def test_a_held_target_goes_to_its_holder_only():
    holder = np.array([3, EMPTY, EMPTY])
    won = Claims.ranked([3, 5], [[0], [0, 2]]).grant(3, seed=0, round=1, holder=holder)
    assert (won.agent.tolist(), won.target.tolist()) == ([3, 5], [0, 2])  # 3 stays, 5 never had cell 0


def test_claims_of_one_target_each_skip_none_and_minus_one_and_travel_in_a_partial_as_json():
    class Moves(Partial):
        claims: Claims = Claims()

    c = Claims.of([1, 2, 3, 4], [7, None, -1, np.int64(2)])
    assert (c.agent.tolist(), c.target.tolist()) == ([1, 4], [7, 2])
    assert Claims.ranked(np.array([1, 2]), np.array([[5, 6, -1], [-1, 8, 9]])) == Claims.ranked([1, 2], [[5, 6], [8, 9]])
    wire = Moves(claims=Claims.ranked([1, 2], [[5, 6], [8]])).model_dump(mode="json")
    assert wire == {"claims": {"agent": [1, 1, 2], "target": [5, 6, 8], "rank": [0, 1, 0]}}
    assert Moves.model_validate(wire).claims == Claims.ranked([2, 1], [[8], [5, 6]])
    assert Claims.merge([]) == Claims() and len(Claims.merge([c, c])) == 4


def test_a_claim_on_a_target_that_does_not_exist_or_is_not_a_whole_number_is_refused_naming_the_agent():
    with pytest.raises(ClaimError, match=r"^agent 7 claims cell 40, which does not exist \(cells are 0\.\.39\)$"):
        Claims.of([9, 7], [3, 40]).grant(40, seed=1, round=2, what="cell")
    with pytest.raises(ClaimError, match=r"agent 3 claims cell -2, which does not exist"):
        Claims.of([3], [-2]).grant(40, seed=1, round=2, what="cell")
    with pytest.raises(ClaimError, match=r"^agent 5 claims 2\.5: a target is a whole number$"):
        Claims.of([5], [2.5])
    with pytest.raises(ClaimError, match=r"agent 6 claims 'a': a target is a whole number"):
        Claims.ranked([6], [["a"]])
    with pytest.raises(ClaimError, match=r"holder: one value per cell \(40\)"):
        Claims.of([1], [2]).grant(40, seed=1, round=2, holder=np.zeros(3), what="cell")


# -- invariants -----------------------------------------------------------------------------------
def test_a_checks_result_is_read_as_holds_or_a_witness():
    for holds in (None, True, np.True_, "", [], np.zeros(0), 0, set()):
        assert witness(holds) is None
    assert witness(False) == "no witness given"
    assert witness(np.arange(3, 10)) == "[3, 4, 5, 6, 7] (and 2 more)"
    assert witness("cell 4 holds agents 1, 2") == "cell 4 holds agents 1, 2"
    assert witness(3) == "3"
    assert distinct(np.array([4, 1, 4, 2, 1]), what="cell", who="agents") == "cell 1 is held by agents 1, 4 (and 1 other cells)"
    assert distinct(np.array([4, 1, 4]), where=np.array([True, True, False])) is None


def test_invariants_are_declared_on_the_env_and_named_when_they_break_or_raise():
    class Base:
        @invariant("scores are not negative")
        def positive(self, state, world):
            return np.flatnonzero(world < 0)

        @invariant("dropped below")
        def replaced(self, state, world):
            return False

    class Child(Base):
        def replaced(self, state, world):  # overridden by a plain method: no longer an invariant
            return None

        @invariant("the state says yes")
        def says(self, state, world):
            return state["yes"] or "it says no"

    assert declared(Child) == [("scores are not negative", "positive"), ("the state says yes", "says")]
    check(Child(), {"yes": True}, np.array([1, 2]), "after round 1")
    with pytest.raises(InvariantError, match=r"^invariant 'scores are not negative' is broken after round 3: \[1\]$"):
        check(Child(), {"yes": True}, np.array([1, -2]), "after round 3")
    with pytest.raises(InvariantError, match=r"^invariant 'the state says yes' raised after round 2: KeyError: 'yes'$"):
        check(Child(), {}, np.array([1]), "after round 2")
    with pytest.raises(TypeError, match="a short sentence naming the rule"):
        invariant("")


# -- space ----------------------------------------------------------------------------------------
def test_neighbourhoods_with_a_radius_in_three_shapes():
    assert [len(offsets(r, s)) for r, s in ((1, "moore"), (2, "moore"), (2, "von_neumann"), (3, "cross"))] == \
        [8, 24, 12, 12]
    g = Grid(10, 10)
    cells = np.arange(100)
    assert (g.neighbourhoods(cells) == g.neighbourhoods(cells, radius=1, shape="moore")).all()
    assert (g.neighbourhoods(cells, moore=False) == g.neighbourhoods(cells, radius=1, shape="von_neumann")).all()
    assert sorted(g.neighbours(0, radius=2, shape="cross")) == [1, 2, 8, 9, 10, 20, 80, 90]
    assert sorted(g.neighbours(0, radius=2, shape="von_neumann")) == [1, 2, 8, 9, 10, 11, 19, 20, 80, 90, 91, 99]
    assert sorted(Grid(10, 10, torus=False).neighbours(0, radius=2, shape="cross")) == [1, 2, 10, 20]
    with pytest.raises(ValueError, match=r"radius 2: on a 4×4 torus a neighbourhood that wide wraps onto itself"):
        Grid(4, 4).neighbourhoods([0], radius=2)
    with pytest.raises(ValueError, match="shape 'hex'"):
        offsets(1, "hex")  # type: ignore[arg-type]


def test_line_of_sight_is_blocked_by_an_opaque_cell_between_and_wraps_the_short_way_on_a_torus():
    g = Grid(10, 10)
    opaque = np.zeros(100, dtype=bool)
    opaque[g.cell(5, 5)] = True
    pairs = [((3, 5), (7, 5), False), ((3, 5), (3, 8), True), ((3, 3), (7, 7), False), ((5, 5), (7, 5), True),
             ((3, 5), (5, 5), True), ((9, 5), (1, 5), True)]  # the target itself may be opaque; 9→1 wraps via 0
    seen = g.line_of_sight([g.cell(*a) for a, _, _ in pairs], [g.cell(*b) for _, b, _ in pairs], opaque)
    assert seen.tolist() == [ok for _, _, ok in pairs]
    opaque[g.cell(0, 5)] = True
    assert g.line_of_sight([g.cell(9, 5)], [g.cell(1, 5)], opaque).tolist() == [False]


def test_ranked_cells_best_first_then_nearest_skipping_cells_not_free_ready_for_claims():
    g = Grid(10, 10)
    sugar = np.arange(100) % 7
    occupant = np.full(100, EMPTY)
    occupant[[1, 10]] = [5, 6]
    rows = g.ranked([0, 55], sugar, radius=2, shape="cross", free=occupant == EMPTY, stay=True)
    assert rows[0].tolist() == [90, 20, 80, 9, 2, 8, 0, EMPTY, EMPTY]  # 1 and 10 are taken; its own cell 0 last
    assert rows[1].tolist() == [55, 54, 75, 53, 45, 65, 57, 56, 35]  # its own cell ties with the best: nearest first
    by_agent = g.ranked([0], lambda cells: np.where(cells == 2, 100, 0), radius=2, shape="cross")
    assert by_agent[0, 0] == 2
    assert Claims.ranked([8, 9], rows).agent.tolist() == [8] * 7 + [9] * 9


def test_moves_and_the_witness_of_each_agent_on_its_own_cell():
    g = Grid(10, 10)
    cell = np.array([0, 55])
    occupant = np.full(100, EMPTY)
    occupant[cell] = [0, 1]
    assert g.misplaced(cell, occupant) is None
    moved_cell, moved_occupant = g.move(cell, occupant, [1], [56])
    assert moved_cell.tolist() == [0, 56] and moved_occupant[55] == EMPTY and moved_occupant[56] == 1
    assert g.misplaced(moved_cell, moved_occupant) is None
    assert g.misplaced(np.array([3, 3]), occupant) == "cell 3 holds agents 0, 1"
    assert g.misplaced(np.array([0, 56]), occupant) == "agent 1 stands on cell 56, whose occupant is -1"
    stray = occupant.copy()
    stray[99] = 1
    assert g.misplaced(cell, stray) == "cell 99's occupant is 1, who does not stand there"
    assert g.misplaced(np.array([0, 55, 3]), occupant, alive=np.array([True, True, False])) is None
    assert "not on the 10×10 grid" in g.misplaced(np.array([0, 100]), occupant)


# -- the world-column selector --------------------------------------------------------------------
class Herd(World):
    alive = column("bool", "agents")
    name = column("string", "agents")
    grass = column("int32", "patches")


def test_a_column_selector_picks_from_the_rounds_world_and_is_refused_naming_what_is_missing():
    herd = Herd({"agents": 6, "patches": 2}, alive=[True, False, True, True, False, False])
    sel = select.checked(select.column("alive"), 6, "E.select(state, 2, world)", herd)
    assert select.to_wire(sel) == {"kind": "column", "name": "alive"}  # a few bytes for any number of agents
    assert sel.pick(np.array([1, 2, 3]), seed=1, round_=2, profiles=None, world=herd).tolist() == [False, True, True]
    for name, why in (("dead", r"column 'dead' is not a column of Herd \(alive, name, grass\)"),
                      ("grass", r"column 'grass' is a int32 column of size 'patches'"),
                      ("name", r"column 'name' is a string column")):
        with pytest.raises(SelectionError, match=r"E\.select\(state, 2, world\): " + why):
            select.checked(select.column(name), 6, "E.select(state, 2, world)", herd)
    with pytest.raises(SelectionError, match="the simulation has no World"):
        select.checked(select.column("alive"), 6, "E.select(state, 2, world)", None)


def test_the_engine_tells_the_older_hooks_from_the_newer_by_their_arguments():
    class A:
        def old(self, state, round): ...
        def new(self, state, round, world): ...
        def loose(self, *args): ...
        def defaulted(self, state, round, world=None): ...

    a = A()
    assert [takes(a.old, 3), takes(a.new, 3), takes(a.loose, 3), takes(a.defaulted, 3)] == [False, True, True, True]
    assert [takes(A.old, 3), takes(A.new, 3)] == [False, True]  # unbound: `self` is not counted
