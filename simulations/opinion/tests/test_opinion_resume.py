"""A run resumed (or forked) after any round equals the uninterrupted run, on a graph too:
every agent's state is in its checkpoint (populace.sdk.testing.check_resume; issue 25)."""

from populace_opinion import Opinion

from populace.sdk.testing import check_resume


def test_a_run_resumed_after_any_round_is_the_uninterrupted_run():
    check_resume(Opinion, {"agents": 30, "rounds": 4, "seed": 3})
    check_resume(Opinion, {"agents": 36, "rounds": 3, "graph": {"generator": "small-world", "degree": 4,
                                                                "rewire": 0.2}}, hosts=2)
