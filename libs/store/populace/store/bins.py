"""How a numeric measure is binned for a histogram: the report's figures and the manager's live
distribution (``populace.store.live``) draw the same bins. Pure: no plotting library here,
so the recorder can bin without importing Plotly."""

from __future__ import annotations

import math

HIST_BINS = 20
MAX_INTEGER_BINS = 60  # an integer measure spanning at most this many values gets one bin per value


def histogram_bins(lo: float, hi: float, integer: bool, bins: int = HIST_BINS) -> tuple[float, float, int]:
    """(lo, hi, bins) for a histogram of values in [lo, hi]: one bin per value for an integer
    measure with a small span (bars centred on the integers), else `bins` equal bins."""
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    if integer and hi - lo <= MAX_INTEGER_BINS:
        a, b = math.floor(lo) - 0.5, math.ceil(hi) + 0.5
        return a, b, int(b - a)
    return lo, hi, bins
