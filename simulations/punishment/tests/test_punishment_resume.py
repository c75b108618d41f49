"""A run resumed (or forked) after any round equals the uninterrupted run: every agent's state
is in its checkpoint (populace.sdk.testing.check_resume)."""

from populace_punishment import Punishment

from populace.sdk.testing import check_resume


def test_a_run_resumed_after_any_round_is_the_uninterrupted_run():
    # 30 agents in blocks of 12: groups of 4, and a last block of 6 (a group of 4 and a pair)
    check_resume(Punishment, {"agents": 30, "rounds": 4, "game": {"block": 12}})
