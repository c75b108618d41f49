"""A run resumed (or forked) after any round equals the uninterrupted run, groups and payoffs
included: every agent's state is in its checkpoint (populace.sdk.testing.check_resume; issue 25)."""

from populace_public_goods import PublicGoods

from populace.sdk.testing import check_resume


def test_a_run_resumed_after_any_round_is_the_uninterrupted_run():
    check_resume(PublicGoods, {"agents": 23, "rounds": 4, "seed": 1, "game": {"group_size": 4}})
    check_resume(PublicGoods, {"agents": 23, "rounds": 3, "game": {"group_size": 5}}, hosts=2)


def test_teams_within_firms_resumed_after_any_round_are_the_uninterrupted_run():
    from populace_public_goods.firms import PublicGoodsFirms

    check_resume(PublicGoodsFirms, {"agents": 47, "rounds": 3, "game": {"group_size": 5},
                                    "firm": {"size": 20, "match": 0.5}})
