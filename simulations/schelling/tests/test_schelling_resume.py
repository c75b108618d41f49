"""A run resumed (or forked) after any round equals the uninterrupted run: every agent's state
is in its checkpoint (populace.sdk.testing.check_resume; issue 25)."""

from populace_schelling import Schelling

from populace.sdk.testing import check_resume


def test_a_run_resumed_after_any_round_is_the_uninterrupted_run():
    check_resume(Schelling, {"agents": 60, "rounds": 4, "grid": {"width": 10, "height": 10}})
