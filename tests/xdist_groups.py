"""How the test command's `-n N --dist loadgroup` shares the suite between pytest-xdist's workers
(tests/conftest.py hands xdist this scheduler). A worker takes a group of tests whole; every test is
in one: its module by default (a module-scoped stack starts once, as in a serial run), or one of
the groups below, shared across modules by tests that must not run beside each other.

The groups are worked out here from each test's path, not from `xdist_group` marks: with pytest
9.2 the marks no longer reach xdist's scheduler (pytest-xdist#1386: it renames node ids, which
pytest 9.2 ignores), so loadgroup would silently run every test on its own."""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

# Real models, SmolLM2 on llama.cpp and vLLM's CPU build, each take every core while they generate:
# two such tests at once starve each other's generation past their liveness deadlines, so they
# share one worker (the vllm tier's replica, ~5 GB and 1-3 min to start, is its session fixture).
# Over the whole group they use about one core (167 s of wall, 180 s of CPU alone, 2026-12-03).
REAL_MODEL = "real-model"
SHARED_GROUPS = {
    "tests/vllm/": REAL_MODEL,
    "tests/compose/": "compose",  # one Docker engine; the `images` session fixture builds the images
}
REAL_MODEL_MODULES = frozenset({
    "tests/e2e/test_bench_llm_e2e.py",
    "tests/e2e/test_keyed_model_e2e.py",
    "tests/e2e/test_local_model_e2e.py",
    "tests/e2e/test_personas_generate.py",
    "tests/e2e/test_replica_failover.py",
    "tests/e2e/test_report_browser.py",
})
# The order the groups are handed out in: the longest first, so that no long group starts last
# while the other workers are idle (unit modules are many and short: they fill the gaps). The
# longest groups by name (seconds each took in the full suite on 3 workers, 2026-12-03, from the
# junit XML of a clean-clone run), then the rest of the end-to-end tier, then the integration tier,
# then everything else; within one rank, collection order. Only an order: a group missing here is
# still run. bench/suite_replay.py replays a run's junit times through these rules: with the fault
# matrix at half its time, this order still replays shortest (592 s against 616 s with it after
# compose or beside state integrity, from 2026-12-04's junit times).
FIRST = (
    "tests/e2e/test_faults_e2e.py",  # 184 s; 87 s alone once it ran with users only (2026-12-04)
    REAL_MODEL,  # 171 s (more where llama.cpp is built and vLLM's environment prepared first)
    "compose",  # 107 s (more where the images are built first)
    "tests/e2e/test_state_integrity_e2e.py",  # 60 s
    "tests/e2e/test_live_results.py",  # 58 s
    "tests/e2e/test_guide.py",  # 58 s
    "tests/e2e/test_graph_messages.py",  # 56 s
    "tests/e2e/test_shapes_e2e.py",  # 47 s
    "tests/e2e/test_fuzz_e2e.py",  # 42 s
    "tests/e2e/test_manager_browser.py",  # 37 s
    "tests/e2e/test_manager_run_page_browser.py",  # 36 s
    "tests/e2e/test_steering_e2e.py",  # 34 s
    "tests/e2e/test_host_loss.py",  # 33 s
    "tests/e2e/test_live_agents.py",  # 28 s
    "tests/e2e/test_populations_e2e.py",  # 26 s
    "tests/e2e/",
    "tests/integration/",
)


# Groups that start stacks, browsers, models or containers and wait on heartbeats and deadlines
# (every end-to-end module, the real models, compose, the NATS cluster): at most HEAVY_AT_ONCE
# workers hold such groups at a time. A third worker takes the light groups (unit, integration,
# the simulations' own tests) beside them: alone, two workers left the 2 cores about a third idle;
# three with no such bound starved the fast-heartbeat and SmolLM2 tests (80fd232).
HEAVY_AT_ONCE = 2
HEAVY_MODULES = frozenset({"tests/integration/test_cluster.py"})
# Heavy groups that mostly wait (on heartbeats, deadlines, a paced model, a browser): each used
# under half a core for its wall time when run alone (bench/results/stop33/suite-cpu-per-module.md).
# One of them may make a third heavy group at once; beside the real models, only if the other is
# one too (about 1 + 0.4 + 0.4 cores of the 2).
WAITING_MODULES = frozenset({
    "tests/e2e/test_faults_e2e.py",  # 0.41 of a core
    "tests/e2e/test_state_integrity_e2e.py",  # 0.27
    "tests/e2e/test_live_results.py",  # 0.36
    "tests/e2e/test_manager_run_page_browser.py",  # 0.25
    "tests/e2e/test_manager_browser.py",  # 0.47
    "tests/e2e/test_steering_e2e.py",  # 0.40
    "tests/e2e/test_host_loss.py",  # 0.43
    "tests/e2e/test_live_agents.py",  # 0.20
    "tests/e2e/test_incremental_checkpoints_e2e.py",  # 0.46
    "tests/e2e/test_children_die_with_up.py",  # 0.19
    "tests/e2e/test_shared_limits_e2e.py",  # waits on a paced provider (~30 s wall, light CPU)
    "tests/e2e/test_scene_batches_e2e.py",  # 0.3 (15.6 s CPU over 57 s wall, services included)
    "tests/e2e/test_fuzz_e2e.py",  # 0.43 on a one-process stack (20.3 s CPU over 47 s wall, 2026-12-05)
    "tests/e2e/test_disk_full_e2e.py",  # 0.27 on a one-process stack (8 s CPU over 25-35 s wall)
    "tests/e2e/test_owner_writes_e2e.py",  # 0.38 with one process apart (8.9 s CPU over 23.7 s, 2026-12-05)
    "tests/e2e/test_replica_hijack_e2e.py",  # 0.29 on a one-process stack (9.1 s CPU over 31.6 s)
})


def is_heavy(group: str) -> bool:
    return group in (REAL_MODEL, "compose") or group.startswith("tests/e2e/") or group in HEAVY_MODULES


def may_take(group: str, others: list[set[str]]) -> bool:
    """Whether a worker may take `group` while the other workers hold `others` (each the groups
    of which a worker still has tests to run). A heavy group: while fewer than HEAVY_AT_ONCE
    others hold one; or as one more heavy group at once, if one of the three mostly waits (two,
    where the real models are one of them). A light group: at any time, except beside the real
    models when two workers are busy already, as on two workers."""
    busy = [held for held in others if held]
    if is_heavy(group):
        heavy = [held for held in busy if any(is_heavy(h) for h in held)]
        if len(heavy) < HEAVY_AT_ONCE:
            return True
        if len(heavy) > HEAVY_AT_ONCE:
            return False
        # the heavy groups at once if it takes this one, one per worker: a worker that holds two
        # (it took its next as its last tests ran) counts as working if either does
        kinds = [*("real" if REAL_MODEL in held else "works" if held - WAITING_MODULES else "waits"
                   for held in ({h for h in held if is_heavy(h)} for held in heavy)),
                 "real" if group == REAL_MODEL else "waits" if group in WAITING_MODULES else "works"]
        return kinds.count("waits") >= (len(kinds) - 1 if "real" in kinds else len(kinds) - HEAVY_AT_ONCE)
    return not any(REAL_MODEL in held for held in busy) or len(busy) < 2


def held(workload: dict[str, dict[str, bool]]) -> set[str]:
    """The groups of a worker's workload (group -> {test: done}) with tests still to run; none
    when one test is left. An xdist worker starts a test only once it holds the next one (pytest
    tears fixtures down by what comes next), so its last test waits, not started, for more work
    or the shutdown: that worker is idle. Counted as holding the group, it was never offered
    work again (only workers holding nothing were), and the rules refused others beside it: in
    a run at load 10 two workers sat idle for 440 s, each on the last test of its group, while
    the third ran every group left."""
    left = {group for group, tests in workload.items() if not all(tests.values())}
    return left if sum(not done for tests in workload.values() for done in tests.values()) > 1 else set()


def group_of(nodeid: str) -> str:
    """The group of the test `nodeid` (its path is relative to the repository root)."""
    path = nodeid.split("::", 1)[0]
    for prefix, group in SHARED_GROUPS.items():
        if path.startswith(prefix):
            return group
    return REAL_MODEL if path in REAL_MODEL_MODULES else path


def rank(group: str) -> int:
    return next((i for i, first in enumerate(FIRST) if group.startswith(first)), len(FIRST))


class GroupScheduling(LoadScopeScheduling):
    """xdist's loadscope scheduling with a scope per group (above), handed out in rank order, a
    group only to a worker that `may_take` it (a worker left without one waits, and is offered
    work again whenever any test ends)."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)

    def _assign_work_unit(self, node) -> None:
        others = [held(self.assigned_work[other]) for other in self.nodes if other is not node]
        allowed = [group for group in self.workqueue if may_take(group, others)]
        if not allowed:
            return
        position = {}
        for i, nodeid in enumerate(self.collection or ()):
            position.setdefault(group_of(nodeid), i)
        first = min(allowed, key=lambda group: (rank(group), position.get(group, 0)))
        self.workqueue.move_to_end(first, last=False)  # the base class takes the queue's first unit
        super()._assign_work_unit(node)

    def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        for other in self.nodes:  # an idle worker may take a group now (or stop: none left)
            if other is not node and not other.shutting_down and not held(self.assigned_work[other]):
                self._reschedule(other)
