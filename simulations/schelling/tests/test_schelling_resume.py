"""A run resumed (or forked) after any round equals the uninterrupted run: every agent's state
is in its checkpoint (populace.sdk.testing.check_resume; issue 25) — with moves anywhere, and with
nearby moves by claims where only the unhappy take a turn (issue 37)."""

import pytest
from populace_schelling import Schelling

from populace.sdk.testing import check_resume


@pytest.mark.parametrize("rule", [{}, {"move": "nearby", "radius": 2, "ask": "unhappy", "threshold": 0.5}],
                         ids=["anywhere", "nearby-unhappy"])
def test_a_run_resumed_after_any_round_is_the_uninterrupted_run(rule):
    check_resume(Schelling, {"agents": 60, "rounds": 4, "grid": {"width": 10, "height": 10}, "rule": rule})
