"""A run resumed (or forked) after any round equals the uninterrupted run — outcomes, rounds and
what each reader was shown: every agent's state is in its checkpoint
(populace.sdk.testing.check_resume; issue 25)."""

import pytest
from populace_feed import Microblog

from populace.sdk.testing import check_resume


@pytest.mark.parametrize("interest", [0.0, 1.5])
def test_a_run_resumed_after_any_round_is_the_uninterrupted_run(interest):
    check_resume(Microblog, {"agents": 60, "rounds": 4, "recommender": {"interest": interest}})
