"""Sample agent profiles from a :class:`~populace.population.config.PopulationConfig`.

:func:`sample_profiles` returns one ``dict`` per agent, attribute name → value, keys in
declaration order. How each attribute is drawn:

* **categorical, quotas** — exact: with ``count == total`` every category gets exactly its
  quota; with another ``count`` the quotas are scaled by ``count / total`` with the
  largest-remainder method, so the counts still sum to ``count`` exactly (no agent is
  dropped or added). The values are then shuffled with the seed.
* **categorical, weights** — exact too: the counts are ``weight × N`` rounded by largest
  remainder (ties go to the category declared first), then shuffled. Five equal weights
  give exactly 10 each for N = 50 and 20,000 each for N = 100,000.
* **conditional** — within each parent group (the agents sharing one parent category) the
  group's size is split over the child categories by largest remainder, then shuffled
  inside the group. Every child value is one allowed under its parent, and every group's
  proportions are exact.
* **numeric** — seeded draws. ``uniform``: uniform on ``[min, max]``. ``normal``: a
  *truncated* normal, exact — rejection sampling while the bounds keep at least 5% of the
  mass, inverse-CDF sampling otherwise; values are never clipped, so nothing piles up at the
  bounds. ``bins``: counts per bin allocated exactly (largest remainder), values uniform
  inside each bin, then shuffled. ``integer: true`` rounds ``normal`` draws to the nearest
  whole number within ``[ceil(min), floor(max)]``, draws ``uniform`` from the whole numbers
  in that range, and draws each bin from the whole numbers ``min..max``.

Determinism: each attribute has its own ``random.Random`` seeded from
``(seed, attribute name)``, so the same config, seed and count give the same profiles on any
machine, and adding an attribute does not change the values of the others.
"""

from __future__ import annotations

import math
import random
from statistics import NormalDist

from populace.population.allocation import largest_remainder
from populace.population.config import (
    CategoricalAttribute,
    ConditionalAttribute,
    NumericAttribute,
    PopulationConfig,
)

__all__ = ["attribute_rng", "sample_profiles"]

_REJECTION_MIN_MASS = 0.05


def attribute_rng(seed: int, attribute: str) -> random.Random:
    """The generator used for one attribute (string seeds hash with sha512: portable)."""
    return random.Random(f"populace.population:{seed}:{attribute}")


def sample_profiles(cfg: PopulationConfig, count: int | None = None,
                    seed: int | None = None) -> list[dict]:
    """``count`` profiles (default ``cfg.total``); ``seed`` overrides ``cfg.seed``."""
    n = cfg.total if count is None else count
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"count must be an integer >= 1 (got {n!r})")
    s = cfg.seed if seed is None else seed
    columns: dict[str, list] = {}
    for name, attr in cfg.attributes.items():
        rng = attribute_rng(s, name)
        if isinstance(attr, CategoricalAttribute):
            columns[name] = _categorical(attr, n, cfg.total, rng)
        elif isinstance(attr, ConditionalAttribute):
            columns[name] = _conditional(attr, columns[attr.given], n, rng)
        elif isinstance(attr, NumericAttribute):
            columns[name] = _numeric(attr, n, rng)
        else:  # pragma: no cover - the config model admits no other kind
            raise TypeError(f"unknown attribute kind for {name!r}")
    names = list(columns)
    return [dict(zip(names, row)) for row in zip(*columns.values())]


def _expand(categories, counts, rng: random.Random) -> list:
    values: list = []
    for cat, k in zip(categories, counts):
        values.extend([cat] * k)
    rng.shuffle(values)
    return values


def _categorical(attr: CategoricalAttribute, n: int, total: int, rng: random.Random) -> list:
    table = attr.quotas if attr.quotas is not None else attr.weights
    cats = list(table)  # type: ignore[arg-type]
    if attr.quotas is not None and n == total:
        counts = list(attr.quotas.values())
    else:
        counts = largest_remainder(list(table.values()), n)  # type: ignore[union-attr]
    return _expand(cats, counts, rng)


def _conditional(attr: ConditionalAttribute, parent: list, n: int, rng: random.Random) -> list:
    groups: dict[str, list[int]] = {}
    for i, v in enumerate(parent):
        groups.setdefault(v, []).append(i)
    out: list = [None] * n
    for parent_cat, weights in attr.weights_by.items():  # declaration order: deterministic
        idx = groups.get(parent_cat)
        if not idx:
            continue
        values = _expand(list(weights), largest_remainder(list(weights.values()), len(idx)), rng)
        for i, v in zip(idx, values):
            out[i] = v
    return out


def _numeric(attr: NumericAttribute, n: int, rng: random.Random) -> list:
    if attr.uniform is not None:
        lo, hi = attr.uniform.min, attr.uniform.max
        if attr.integer:
            a, b = math.ceil(lo), math.floor(hi)
            span = b - a + 1
            rand = rng.random
            return [min(a + int(rand() * span), b) for _ in range(n)]
        rand = rng.random
        width = hi - lo
        return [min(lo + rand() * width, hi) for _ in range(n)]
    if attr.normal is not None:
        sp = attr.normal
        values = _truncated_normal(sp.mean, sp.std, sp.min, sp.max, n, rng)
        if attr.integer:
            a, b = math.ceil(sp.min), math.floor(sp.max)
            return [min(max(round(x), a), b) for x in values]
        return values
    bins = attr.bins or []
    counts = largest_remainder([b.weight for b in bins], n)
    values: list = []
    rand = rng.random
    for b, k in zip(bins, counts):
        if attr.integer:
            a, top = int(b.min), int(b.max)
            span = top - a + 1
            values.extend(min(a + int(rand() * span), top) for _ in range(k))
        else:
            lo, width = b.min, b.max - b.min
            values.extend(min(lo + rand() * width, b.max) for _ in range(k))
    rng.shuffle(values)
    return values


def _truncated_normal(mean: float, std: float, lo: float, hi: float, n: int,
                      rng: random.Random) -> list[float]:
    nd = NormalDist(mean, std)
    c_lo, c_hi = nd.cdf(lo), nd.cdf(hi)
    out: list[float] = []
    if c_hi - c_lo >= _REJECTION_MIN_MASS:
        gauss = rng.gauss
        append = out.append
        while len(out) < n:
            x = gauss(mean, std)
            if lo <= x <= hi:
                append(x)
        return out
    # narrow or far-out bounds: inverse CDF on the kept slice of [0, 1]
    tiny = 1e-300
    rand = rng.random
    inv = nd.inv_cdf
    width = c_hi - c_lo
    for _ in range(n):
        u = min(max(c_lo + rand() * width, tiny), 1.0 - 1e-16)
        out.append(min(max(inv(u), lo), hi))
    return out
