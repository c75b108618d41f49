"""Bounded storage, the pure parts: which subjects a recorded run's purge removes, which
checkpoint objects belong to a run and which of them each keep setting prunes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from populace.core import subjects
from populace.core.checkpoints import to_prune
from populace.core.settings import Settings


def matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching, enough for these filters."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


def test_purge_filters_cover_the_bulky_events_of_one_run_only():
    rid = "r1"
    bulky = [subjects.run_outcomes(rid, 3, "host-0"), subjects.run_calls(rid, 1, "gw-7")]
    kept = [subjects.run_started(rid), subjects.run_spawn(rid, "host-0"), subjects.run_spawned(rid, "host-0"),
            subjects.run_round_open(rid, 2), subjects.run_partial(rid, 2, "host-0", 1),
            subjects.run_round_result(rid, 2), subjects.run_done(rid), subjects.run_recorded(rid),
            subjects.run_resumed(rid), subjects.run_fault(rid, "environment")]
    others = [subjects.run_outcomes("r10", 3, "host-0"), subjects.run_calls("r", 1, "gw-7")]
    filters = (subjects.run_outcomes_all(rid), subjects.run_calls_all(rid))
    for subject in bulky:
        assert any(matches(f, subject) for f in filters), subject
    for subject in kept + others:
        assert not any(matches(f, subject) for f in filters), subject


def test_checkpoint_round_reads_a_runs_own_names():
    assert subjects.checkpoint_round("r1", subjects.checkpoint_agents("r1", 4, 1000)) == 4
    assert subjects.checkpoint_round("r1", subjects.checkpoint_env("r1", 12)) == 12
    assert subjects.checkpoint_round("r1", subjects.checkpoint_env("r10", 1)) is None  # another run
    assert subjects.checkpoint_round("r1", subjects.checkpoint_env("r", 1)) is None
    assert subjects.checkpoint_round("r1", "r1.x.env") is None
    assert subjects.checkpoint_round("r1", "r1.2.other") is None
    assert subjects.checkpoint_round("r1", "r1") is None


NAMES = [subjects.checkpoint_agents("r1", n, first) for n in (1, 2, 3) for first in (0, 500)] + \
        [subjects.checkpoint_env("r1", n) for n in (1, 2, 3)] + \
        [subjects.checkpoint_env("r2", 1), subjects.checkpoint_agents("r2", 5, 0), "personas-like-name"]


def test_keep_all_prunes_nothing():
    assert to_prune("r1", NAMES, "all") == []


def test_keep_last_prunes_every_round_but_the_last_of_that_run():
    pruned = to_prune("r1", NAMES, "last")
    assert pruned == sorted(n for n in NAMES if n.startswith(("r1.1.", "r1.2.")))
    assert subjects.checkpoint_env("r1", 3) not in pruned


def test_keep_last_keeps_the_runs_configs_which_an_interview_order_names():
    configs = [subjects.checkpoint_config("r1", 1, "ab" * 32), subjects.checkpoint_config("r1", 3, "cd" * 32)]
    assert all(subjects.is_checkpoint_config(c) for c in configs)
    assert not any(subjects.is_checkpoint_config(n) for n in NAMES)
    assert not set(configs) & set(to_prune("r1", NAMES + configs, "last"))
    assert set(configs) <= set(to_prune("r1", NAMES + configs, "none"))


def test_keep_none_prunes_every_object_of_that_run_only():
    assert to_prune("r1", NAMES, "none") == sorted(n for n in NAMES if n.startswith("r1."))
    assert to_prune("r3", NAMES, "none") == []


def test_retention_settings(monkeypatch):
    s = Settings()
    assert (s.purge_recorded, s.checkpoints_keep, s.run_max_age_s) == (True, "all", 30 * 86400.0)
    monkeypatch.setenv("POPULACE_PURGE_RECORDED", "false")
    monkeypatch.setenv("POPULACE_CHECKPOINTS_KEEP", "last")
    monkeypatch.setenv("POPULACE_RUN_MAX_AGE_S", "86400")
    s = Settings()
    assert (s.purge_recorded, s.checkpoints_keep, s.run_max_age_s) == (False, "last", 86400.0)
    monkeypatch.setenv("POPULACE_CHECKPOINTS_KEEP", "some")
    with pytest.raises(ValidationError):
        Settings()
