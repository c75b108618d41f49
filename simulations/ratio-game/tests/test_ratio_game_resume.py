"""A run resumed (or forked) after any round equals the uninterrupted run: every agent's state
is in its checkpoint (populace.sdk.testing.check_resume; issue 25)."""

from populace_ratio_game import RatioGame

from populace.sdk.testing import check_resume


def test_a_run_resumed_after_any_round_is_the_uninterrupted_run():
    check_resume(RatioGame, {"agents": 30, "rounds": 4, "seed": 2, "model": {"seed": 7}})
    check_resume(RatioGame, {"agents": 30, "rounds": 3, "prompt": {"answer": "cot"}}, hosts=3)
