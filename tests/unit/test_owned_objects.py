"""The pure rules of the checkpoints bucket's layout (populace.core.owned_objects): whose a
subject is, what belongs to no run, who writes an object a name does not give the writer of,
what a refused write says, and the stream's bound per writer and run."""

from __future__ import annotations

from nats.js.api import StorageType
from nats.js.errors import ServiceUnavailableError

from populace.core import bus, checkpoints, owned_objects, runconfigs, subjects
from populace.core.contracts import Layout, RunState, RunWriters, Share
from populace.core.owned_objects import Located, encode_name, locate, strays
from populace.orchestrator import workflow


def test_a_subject_says_its_writer_and_its_run_in_this_layout_and_the_one_before():
    name = "r1.3.agents.100"
    assert locate(subjects.checkpoint_chunks("h1", "r1")) == Located(subjects.checkpoint_chunks("h1", "r1"), "h1",
                                                                     "r1")
    meta = owned_objects.meta_subject("h1", name)
    assert meta == f"$O.checkpoints.M.h1.r1.{encode_name(name)}"
    assert locate(meta) == Located(meta, "h1", "r1", name)
    old_meta, old_chunks = f"$O.checkpoints.M.{encode_name(name)}", f"$O.checkpoints.C.h1.{encode_name(name)}.nuid"
    assert locate(old_meta) == Located(old_meta, None, "r1", name, legacy=True)
    assert locate(old_chunks) == Located(old_chunks, "h1", "r1", name, legacy=True)
    for junk in ("$O.checkpoints.C.h1", "$O.checkpoints.X.a.b", "$O.other.C.h1.r1", "$O.checkpoints.M.!!!"):
        assert locate(junk).rid is None


def test_what_belongs_to_no_run_is_a_stray_and_a_runs_own_writers_never_are():
    located = [locate(s) for s in (subjects.checkpoint_chunks("h1", "r1"), owned_objects.meta_subject("h1", "r1.1.env"),
                                   subjects.checkpoint_chunks("environment", "r1"),
                                   subjects.checkpoint_chunks("h9", "r1"),  # never placed in r1
                                   subjects.checkpoint_chunks("h9", "made-up"),
                                   f"$O.checkpoints.M.{encode_name('r1.1.env')}",  # before: any writer's, r1's
                                   f"$O.checkpoints.M.{encode_name('gone.1.env')}", "$O.checkpoints.C.junk")]
    assert strays(located, {"r1": {"h1", "environment", "orchestrator"}}) == sorted([
        subjects.checkpoint_chunks("h9", "r1"), subjects.checkpoint_chunks("h9", "made-up"),
        f"$O.checkpoints.M.{encode_name('gone.1.env')}", "$O.checkpoints.C.junk"])
    # a run whose placements do not say their hosts (recorded before layouts named shares): any writer
    assert subjects.checkpoint_chunks("h9", "r1") not in strays(located, {"r1": None})


def test_a_runs_writers_are_every_placements_hosts_and_the_services():
    run = RunWriters(run_id="r1", shares=[Share(host_id="h2", epoch=1, ranges=[(0, 10)])],
                     layouts=[Layout(from_round=1, ranges=[(0, 5), (5, 5)], shares=["h0@0", "h-1@0"]),
                              Layout(from_round=3, ranges=[(0, 10)], shares=["h2@1"])])
    assert run.writers(("environment", "orchestrator")) == {"h0", "h-1", "h2", "environment", "orchestrator"}
    before = RunWriters(run_id="r1", shares=[], layouts=[Layout(from_round=1, ranges=[(0, 10)])])
    assert before.writers(("environment",)) is None


def test_the_restore_names_the_host_that_played_each_range_that_round():
    from populace.core.contracts import RunConfig

    state = RunState(run_id="r1", status="running", config=RunConfig(agents=10, rounds=5), round=4,
                     shares=[Share(host_id="h2", epoch=1, ranges=[(0, 5)]), Share(host_id="h1", ranges=[(5, 5)])],
                     layouts=[Layout(from_round=1, ranges=[(0, 5), (5, 5)], shares=["h0@0", "h1@0"]),
                              Layout(from_round=3, ranges=[(0, 5), (5, 5)], shares=["h2@1", "h1@0"])],
                     checkpoints={"r1.3.agents.0": "a" * 64})
    assert workflow.writers_for(state, 2) == {"r1.2.agents.0": "h0", "r1.2.agents.5": "h1"}
    assert workflow.writers_for(state, 3) == {"r1.3.agents.0": "h2", "r1.3.agents.5": "h1"}
    assert workflow.restore_point(state).writers == {"r1.3.agents.0": "h2", "r1.3.agents.5": "h1"}


def test_a_name_says_its_writer_unless_it_is_an_agents_object():
    assert checkpoints.writer_of("r1.2.env") == checkpoints.writer_of("r1.0.world") == "environment"
    assert checkpoints.writer_of(subjects.checkpoint_config("r1", 1, "a" * 64)) == runconfigs.WRITER == "orchestrator"
    assert checkpoints.writer_of(subjects.checkpoint_partial("r1", 2, "host-1@3")) == "host-1"
    assert checkpoints.writer_of("r1.2.agents.0") is None


def test_a_refused_write_names_the_store_and_the_setting_that_bounds_it():
    def refused(what: str) -> str:
        return owned_objects.full_reason(ServiceUnavailableError(code=503, err_code=10077, description=what), "h9", "r1")

    assert refused("maximum messages per subject exceeded") == (
        "h9 has stored all it may for run r1 in the object store 'checkpoints' (its bound per writer and run: "
        "POPULACE_CHECKPOINTS_WRITER_RUN_MAX_BYTES, set when the store is created)")
    assert refused("maximum bytes exceeded").startswith(
        "the object store 'checkpoints' is full (POPULACE_CHECKPOINTS_MAX_BYTES)")


def test_the_bound_per_writer_and_run_is_a_share_of_the_store_and_never_too_few_messages():
    cfg = bus.provisioning.checkpoints_stream(StorageType.FILE, 1, 16 * 2**30)
    assert cfg.max_msgs_per_subject == 16 * 2**30 // 4 // owned_objects.CHUNK_BYTES == 32_768
    assert (cfg.discard_new_per_subject, cfg.allow_rollup_hdrs, cfg.max_msg_size) == (
        True, False, owned_objects.MAX_MESSAGE_BYTES)
    assert bus.provisioning.checkpoints_stream(StorageType.MEMORY, 1, 2**30).max_msgs_per_subject == 32_768
    assert bus.provisioning.checkpoints_stream(StorageType.FILE, 1, 2**40).max_msgs_per_subject == 2**40 // 4 // 2**17
    assert bus.provisioning.checkpoints_stream(StorageType.MEMORY, 1, 2**30, 4 * 2**20).max_msgs_per_subject == 32
