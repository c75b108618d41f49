"""A round open is checked against the run state the orchestrator wrote before announcing
it: a forged or corrupted announcement is refused, an older one passes (receivers drop it)."""

from __future__ import annotations

from populace.core.admission import may_lag, open_refusal
from populace.core.contracts import ConfigRef, RoundOpen, RunConfig
from populace.orchestrator.workflow import new_run, on_spawned

CONFIG = RunConfig(agents=10, rounds=3)


def running():
    s = new_run("r1", CONFIG, {"h1": [(0, 6)], "h2": [(6, 4)]})
    s, _ = on_spawned(s, "h1", 0)
    s, _ = on_spawned(s, "h2", 0)
    return s


def opened(state, **change) -> RoundOpen:
    fields = dict(run_id="r1", round=state.round, expected=10, config_ref=state.config_ref,  # noqa: C408 — merged below
                  observation=state.observation,
                  env_state=state.env_state, opened_at=0.0, epoch=state.epoch,
                  shares={sh.key: sh.count for sh in state.shares})
    return RoundOpen(**{**fields, **change})


def test_the_orchestrators_announcement_passes():
    s = running()
    assert s.round == 1 and open_refusal(s, opened(s)) is None and not may_lag(s, opened(s))


def test_a_forged_announcement_is_refused_with_the_reason():
    s = running()
    assert open_refusal(s, opened(s, round=3)) == (
        "round 3 (epoch 0) is not open in run r1: its state is at round 1, epoch 0")
    assert may_lag(s, opened(s, round=3))  # read the state again before refusing: it may lag
    assert open_refusal(s, opened(s, epoch=2)).startswith("round 1 (epoch 2) is not open")
    assert open_refusal(s, opened(s, shares={"h1@0": 6, "h9@0": 4})) == "round 1 of run r1: its shares is not the run's"
    assert open_refusal(s, opened(s, observation={"history": [0]})) == (
        "round 1 of run r1: its observation is not the run's")
    assert open_refusal(s, opened(s, config_ref=ConfigRef.of(RunConfig(agents=10, rounds=9)))) == (
        "round 1 of run r1: its config is not the run's")
    # the run's config, but said to apply from another round: not the run's either
    assert open_refusal(s, opened(s, config_ref=ConfigRef.of(CONFIG, 2))) == (
        "round 1 of run r1: its config is not the run's")
    assert open_refusal(None, opened(s)) == "run r1 is not known"


def test_an_older_announcement_passes_and_a_stopped_run_refuses_its_round():
    s = running()
    later = s.model_copy(update={"round": 2})
    assert open_refusal(later, opened(s)) is None  # round 1 again: the receivers know it is past
    paused = s.model_copy(update={"status": "paused"})
    assert open_refusal(paused, opened(s)) == "run r1 is paused, not running"
