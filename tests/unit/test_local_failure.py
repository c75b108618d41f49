"""A local run's failure reason names what the simulation's own code raised and where, also when
the round engine wrapped it (engine.DecideFailed): the engine's frame tells an author nothing."""

from __future__ import annotations

from populace.client.api import local_failure, simulation_error
from populace.sdk.engine import DecideFailed


def environment_bug() -> None:
    raise ZeroDivisionError("the environment's own bug")


def test_an_environment_error_the_engine_wrapped_is_reported_where_the_simulation_raised_it():
    try:
        try:
            environment_bug()
        except ZeroDivisionError as err:
            raise DecideFailed("simulation 'boom': its environment failed to decide round 2: …") from err
    except DecideFailed as wrapped:
        reason = local_failure("boom", 2, simulation_error(wrapped))
    assert reason.startswith("simulation 'boom': round 2 failed: ZeroDivisionError: the environment's own bug "
                             "(at test_local_failure.py:")
    assert reason.endswith(" in environment_bug)")


def test_a_broken_round_rule_is_its_own_reason():
    rule = DecideFailed("simulation 'boom': its environment's state after round 2 is 300,000 bytes as JSON")
    assert simulation_error(rule) is rule
    other = ValueError("an agent's bug")
    assert simulation_error(other) is other
