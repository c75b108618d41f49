"""The agent-host's cyclic collector is sized to the agents it holds (populace.agent_host.collector)."""

import gc

from populace.agent_host import collector


def test_the_young_generation_grows_with_the_agents_held_above_its_floor():
    assert collector.young_threshold(0) == collector.YOUNG_FLOOR
    assert collector.young_threshold(-5) == collector.YOUNG_FLOOR
    assert collector.young_threshold(1_000) == collector.YOUNG_FLOOR
    assert collector.young_threshold(500_000) == 500_000 * collector.YOUNG_PER_TURN
    assert collector.young_threshold(1_000_001) > collector.young_threshold(1_000_000)


def test_fit_to_sets_the_process_thresholds_and_a_drop_brings_them_back():
    before = gc.get_threshold()
    try:
        collector.fit_to(500_000)
        assert gc.get_threshold() == (500_000 * collector.YOUNG_PER_TURN, collector.MIDDLE, collector.OLD)
        collector.fit_to(0)
        assert gc.get_threshold() == (collector.YOUNG_FLOOR, collector.MIDDLE, collector.OLD)
    finally:
        gc.set_threshold(*before)
