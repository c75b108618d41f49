"""How often CPython's cyclic collector runs on an agent-host, by the agents it holds.

A round allocates millions of short-lived objects (tasks, coroutines, futures, outcomes); at
CPython's default young-generation threshold (700) the collector runs thousands of times per
round, walking every young object each time: the floor is 500,000 (a 4-member scene keeps about
11 objects per agent alive through a model's wait, and a smaller floor made every 50th young
collection a middle-generation pass over all of them).

Agents that play single turns (no groups) keep about 4.6 tracked objects each in flight through
the model's wait (measured: 2.3M young objects at most on a host of 500,000). At the floor, the
young collections that run while they wait walk all of them and promote them to be walked again:
0.7 s of each host's CPU in the dummy benchmark's 1M-agent round of single turns. Sized to
YOUNG_PER_TURN per such agent, no collection runs inside the round (0.02 s; round 10.5 -> 9.4-9.7
s). Rounds of groups keep the floor: the 2-member scene benchmark at 1M with a larger young
generation peaked 190 bytes per agent higher (over its 3 KiB) and was no faster, its scenes
allocating more than any size that still collects in time.

The agents' own objects are frozen out of the collector once spawned (populace.sdk.hosting)."""

from __future__ import annotations

import gc

YOUNG_FLOOR = 500_000
# Young objects per agent that plays single turns: what one keeps in flight (4.6), with margin.
YOUNG_PER_TURN = 6
# The older generations' thresholds (collections of the one below), above CPython's (10, 10):
# a middle-generation pass over every object in flight stays rare.
MIDDLE, OLD = 50, 100


def young_threshold(turn_agents: int) -> int:
    """Young-generation threshold for a host whose ungrouped runs hold `turn_agents` agents."""
    return max(YOUNG_FLOOR, YOUNG_PER_TURN * max(0, turn_agents))


def fit_to(turn_agents: int) -> None:
    """Size this process's collector (at start, on every spawn and drop)."""
    gc.set_threshold(young_threshold(turn_agents), MIDDLE, OLD)
