"""The stance scale, [-1, 1], kept in whole micro-units (six decimals).

Stances are summed on every host and the sums merged in any order; integer sums are exact, so
a round's statistics are identical on one host or many. A stance is therefore recorded as its
micro-units over 1,000,000 (`0.35` stays `0.35`; `0.1234567` becomes `0.123457`), and
`to_micro` of a recorded stance gives back exactly the integer the environment summed.
"""

from __future__ import annotations

import math

MICRO = 1_000_000


def to_micro(value: object) -> int | None:
    """A stance in micro-units, or None when `value` is not a finite number in [-1, 1] (a
    boolean is not a number here, whatever Python says)."""
    if value.__class__ is float and -1.0 <= value <= 1.0:  # the common case first (NaN fails the range)
        return round(value * MICRO)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not (math.isfinite(value) and -1 <= value <= 1):
        return None
    return round(value * MICRO)
