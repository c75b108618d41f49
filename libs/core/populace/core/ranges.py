"""A declared range (or set of options) checked on a column of values: shared by the
agent-host, which marks such a row invalid before it counts, and the recorder, which refuses a
batch that carries one."""

from __future__ import annotations


def outside(values: list, valid: list[bool], bounds: tuple[float, float]) -> list[int]:
    """The rows whose valid, present value lies outside `bounds` (inclusive). min/max run in
    C first: on the hot path a batch is almost always within."""
    lo, hi = bounds
    present = [v for v, ok in zip(values, valid) if ok and v is not None]
    if not present or (lo <= min(present) and max(present) <= hi):
        return []
    return [i for i, (v, ok) in enumerate(zip(values, valid)) if ok and v is not None and not lo <= v <= hi]


def not_in(values: list, valid: list[bool], options: frozenset | set) -> list[int]:
    """The rows whose valid, present value is not one of `options` (a categorical measure's)."""
    return [i for i, (v, ok) in enumerate(zip(values, valid)) if ok and v is not None and v not in options]
