"""The groups the test command's xdist workers take whole (tests/xdist_groups.py): shared groups
stay whole across modules, every other test goes with its module, and the names the rules list
are still real paths (a renamed module would silently leave its group)."""

from __future__ import annotations

from pathlib import Path

import xdist_groups as g  # tests/ is on the path: tests/conftest.py's directory

ROOT = Path(__file__).resolve().parents[2]


def test_shared_groups_span_modules_and_other_tests_go_with_their_module():
    assert {g.group_of("tests/vllm/test_vllm_game.py::t"), g.group_of("tests/vllm/test_vllm_replica.py::t[x]")} == {g.REAL_MODEL}
    assert g.group_of("tests/compose/test_compose_stack.py::t") == "compose"
    assert {g.group_of(f"{m}::t") for m in g.REAL_MODEL_MODULES} == {g.REAL_MODEL}
    assert g.group_of("tests/e2e/test_cli.py::test_x[a::b]") == "tests/e2e/test_cli.py"
    assert g.group_of("simulations/vote/tests/test_vote.py::t") == "simulations/vote/tests/test_vote.py"


def test_the_longest_groups_come_first_and_every_group_has_a_rank():
    ranks = [g.rank(g.group_of(f"{p}::t")) for p in ("tests/e2e/test_faults_e2e.py", "tests/e2e/test_report_browser.py",
                                                     "tests/e2e/test_cli.py", "tests/integration/test_bus.py",
                                                     "tests/unit/test_guard.py")]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)


def test_every_module_the_rules_name_exists():
    named = set(g.REAL_MODEL_MODULES) | {f for f in g.FIRST if f.endswith(".py")} | g.WAITING_MODULES
    assert [p for p in sorted(named) if not (ROOT / p).is_file()] == []
    assert all((ROOT / prefix).is_dir() for prefix in g.SHARED_GROUPS)


def test_at_most_two_workers_hold_heavy_groups_and_light_ones_fill_the_third():
    e2e, other_e2e, unit = "tests/e2e/test_cli.py", "tests/e2e/test_guide.py", "tests/unit/test_guard.py"
    assert g.is_heavy(e2e) and g.is_heavy(g.REAL_MODEL) and g.is_heavy("compose")
    assert g.is_heavy("tests/integration/test_cluster.py") and not g.is_heavy(unit)
    assert not g.is_heavy("tests/integration/test_bus.py") and not g.is_heavy("simulations/vote/tests/test_vote.py")
    assert g.may_take(e2e, [set(), set()]) and g.may_take(e2e, [{other_e2e}, set()])
    assert not g.may_take(e2e, [{other_e2e}, {"compose"}])  # two hold heavy groups already
    assert g.may_take(unit, [{other_e2e}, {"compose"}])  # a light group beside them
    assert g.may_take(e2e, [{other_e2e}, {unit}])
    # beside the real models, two workers at most, as on two workers
    assert g.may_take(e2e, [{g.REAL_MODEL}, set()]) and g.may_take(unit, [{g.REAL_MODEL}, set()])
    assert not g.may_take(unit, [{g.REAL_MODEL}, {other_e2e}]) and not g.may_take(e2e, [{g.REAL_MODEL}, {other_e2e}])
    assert not g.may_take(unit, [{g.REAL_MODEL}, {unit}])


def test_a_group_that_mostly_waits_may_be_a_third_heavy_one_and_beside_the_real_models_only_with_another():
    waits, also_waits = "tests/e2e/test_faults_e2e.py", "tests/e2e/test_live_agents.py"
    works, also_works = "tests/e2e/test_cli.py", "tests/e2e/test_guide.py"
    assert {waits, also_waits} <= g.WAITING_MODULES and not {works, also_works} & g.WAITING_MODULES
    assert all(g.is_heavy(m) for m in g.WAITING_MODULES)
    assert g.may_take(waits, [{works}, {also_works}]) and g.may_take(waits, [{works}, {"compose"}])
    assert g.may_take(works, [{waits}, {also_works}])  # the same three, taken in another order
    assert g.may_take(waits, [{also_waits}, {works}]) and g.may_take(waits, [{also_waits}, {also_works, "tests/unit/x.py"}])
    assert not g.may_take(works, [{works}, {also_works}])  # no third that works
    # beside the real models (about a core), two that wait (under half a core each), nothing more
    assert g.may_take(waits, [{g.REAL_MODEL}, {also_waits}]) and g.may_take(waits, [{also_waits}, {g.REAL_MODEL}])
    assert not g.may_take(waits, [{g.REAL_MODEL}, {works}]) and not g.may_take(works, [{g.REAL_MODEL}, {also_waits}])
    assert g.may_take(g.REAL_MODEL, [{waits}, {also_waits}])  # the same three, the other way round
    assert not g.may_take(g.REAL_MODEL, [{waits}, {works}])
    assert not g.may_take("tests/unit/test_guard.py", [{g.REAL_MODEL}, {also_waits}])
    assert not g.may_take(waits, [{works}, {also_works}, {also_waits}])  # never a fourth (-n 4)


def test_a_worker_holds_the_groups_it_has_tests_of_left():
    assert g.held({"a": {"t1": True, "t2": False, "t4": False}, "b": {"t3": True}, "c": {}}) == {"a"}
    assert g.held({"a": {"t1": True, "t2": False}, "b": {"t3": False}}) == {"a", "b"}


def test_a_worker_with_one_test_left_holds_nothing():
    """Its last test waits, not started, until it gets more work or the shutdown: it is idle,
    so it is offered work again and the rules do not count it beside the others."""
    assert g.held({"a": {"t1": True, "t2": False}, "b": {"t3": True}}) == set()
    assert g.held({"a": {"t1": True}}) == set()


class _Worker:
    """What the scheduler asks of an xdist worker: the tests it is sent, its shutdown."""

    def __init__(self) -> None:
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def test_a_worker_left_on_its_last_test_is_offered_the_next_group_when_another_finishes_a_test():
    """The stall of a run at load 10, replayed: w0 is left on the last test of the scene-batches
    module (it waits for more work), w1 runs the real models, w2 a group that waits: nothing may
    join them. The real models done, w1 takes the CLI module; at its next test's end w0 is
    offered the feed module and takes it. Before, w0 counted as holding its module, was never
    offered work again and sat idle."""
    from collections import OrderedDict

    scene, shared, cli, feed = ("tests/e2e/test_scene_batches_e2e.py", "tests/e2e/test_shared_limits_e2e.py",
                                "tests/e2e/test_cli.py", "tests/e2e/test_feed_e2e.py")
    collection = [f"{scene}::a", f"{scene}::b", "tests/vllm/test_vllm_game.py::a", "tests/vllm/test_vllm_game.py::b",
                  f"{shared}::a", f"{shared}::b", f"{cli}::a", f"{cli}::b", f"{cli}::c", f"{feed}::a", f"{feed}::b"]
    w0, w1, w2 = _Worker(), _Worker(), _Worker()
    sched = g.GroupScheduling.__new__(g.GroupScheduling)  # no pytest config: only the work is replayed
    sched.log, sched.collection = (lambda *_: None), collection
    sched.registered_collections = dict.fromkeys((w0, w1, w2), collection)
    sched.assigned_work = {w: {group: dict.fromkeys([t for t in collection if t.startswith(prefix)], False)}
                           for w, group, prefix in ((w0, scene, scene), (w1, g.REAL_MODEL, "tests/vllm/"),
                                                    (w2, shared, shared))}
    sched.workqueue = OrderedDict((m, dict.fromkeys((t for t in collection if t.startswith(m)), False))
                                  for m in (cli, feed))
    assert shared in g.WAITING_MODULES and not {cli, feed} & g.WAITING_MODULES

    sched.mark_test_complete(w0, 0)  # w0 is left on its last test: beside the real models, refused
    sched.mark_test_complete(w1, 2)  # w1 is left on its last: it takes the CLI module; w0 is refused
    assert (w0.sent, w1.sent) == ([], [6, 7, 8])
    sched.mark_test_complete(w1, 3)  # the real models are done: w0 takes the feed
    assert w0.sent == [9, 10] and not sched.workqueue
