"""Exact allocation of N items to categories: the largest-remainder (Hamilton) method."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction


def largest_remainder(weights: Sequence[float | int | Fraction], n: int) -> list[int]:
    """Split ``n`` into integer counts proportional to ``weights``; the counts sum to ``n``.

    Each category first gets ``floor(n * w / sum(w))``; the seats left over go to the
    largest remainders, ties to the earlier category. Arithmetic is exact (fractions), so
    equal weights always give counts that differ by at most one, a category with weight 0
    never gets an item, and exact quotas (weights that are counts summing to ``n``) come
    back unchanged.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0 (got {n})")
    fracs = [Fraction(w) for w in weights]
    if any(f < 0 for f in fracs):
        raise ValueError("weights must not be negative")
    total = sum(fracs)
    if n == 0:
        return [0] * len(fracs)
    if total <= 0:
        raise ValueError("weights must not all be zero")
    shares = [f * n / total for f in fracs]
    counts = [s.numerator // s.denominator for s in shares]
    left = n - sum(counts)
    if left:
        order = sorted(range(len(shares)), key=lambda i: (counts[i] - shares[i], i))
        for i in order[:left]:
            counts[i] += 1
    return counts
