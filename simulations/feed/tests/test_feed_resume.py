"""A run resumed (or forked) after any round equals the uninterrupted run: every agent's state
is in its checkpoint (populace.sdk.testing.check_resume; issue 25)."""

from populace_feed import Microblog

from populace.sdk.testing import check_resume


def test_a_run_resumed_after_any_round_is_the_uninterrupted_run():
    check_resume(Microblog, {"agents": 60, "rounds": 4})
