"""Honest axes: a confidence interval drawn within the game's range says so, and an axis always
shows the lines that matter (an equilibrium at 0 must not sit on the axis's edge). Pure."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from populace.analysis.report.text import number

AXIS_PADDING = 0.05  # share of the span added on both sides of an axis


@dataclass(frozen=True)
class DrawnInterval:
    """A confidence interval as drawn: ``low``/``high`` within the range, the true bounds and
    whether either end was cut."""

    low: float
    high: float
    true_low: float
    true_high: float
    clipped_low: bool
    clipped_high: bool
    bounds: tuple[float, float] | None = None

    @property
    def clipped(self) -> bool:
        return self.clipped_low or self.clipped_high

    def hover(self, fmt=number) -> str:
        """'95% CI [-196.83, 336.83], CI clipped to the range [0.00, 100.00]'."""
        text = f"95% CI [{fmt(self.true_low)}, {fmt(self.true_high)}]"
        if self.clipped and self.bounds is not None:
            text += f", CI clipped to the range [{fmt(self.bounds[0])}, {fmt(self.bounds[1])}]"
        return text


def clip_interval(low: float | None, high: float | None,
                  bounds: tuple[float, float] | None) -> DrawnInterval | None:
    """The interval cut to ``bounds`` (the measure's range; None: drawn as is), or None when the
    interval is undefined (a group of one)."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return None
    if bounds is None:
        return DrawnInterval(low, high, low, high, False, False)
    lo, hi = bounds
    return DrawnInterval(max(low, lo), min(high, hi), low, high, low < lo, high > hi, (lo, hi))


def padded_range(values: Iterable[float | None], bounds: tuple[float, float] | None = None,
                 padding: float = AXIS_PADDING) -> list[float] | None:
    """[low, high] of an axis covering ``values`` (and ``bounds`` when given), widened by
    ``padding`` of its span on both sides so a line at either end stays visible; None when
    there is nothing to cover."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if bounds is not None:
        finite += [float(bounds[0]), float(bounds[1])]
    if not finite:
        return None
    lo, hi = min(finite), max(finite)
    span = hi - lo if hi > lo else max(abs(hi), 1.0)
    return [lo - padding * span, hi + padding * span]
