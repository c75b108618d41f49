"""Sugarscape's rules as pure functions over numpy arrays (Epstein & Axtell 1996, chapter II):
the landscape, growback, harvest and metabolism, what an agent sees and would move to, where
newcomers are placed, and the wealth Gini. The environment calls them; tests call them alone."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from populace.sdk.space import EMPTY, Grid


def capacity(grid: Grid, peaks: list[tuple[float, float]], top: int, reach: float) -> np.ndarray:
    """Each cell's sugar capacity: `top` at a peak (given as fractions of the width and height),
    one level less every `reach × shorter side / top` cells away from the nearest peak
    (Euclidean, the shorter way round on a torus), never below 0. int16, one per cell."""
    x, y = grid.xy(np.arange(grid.cells))
    side = min(grid.width, grid.height)
    step = reach * side / top
    nearest = np.full(grid.cells, np.inf)
    for px, py in peaks:
        dx = np.abs(x - round(px * (grid.width - 1))).astype(np.float64)
        dy = np.abs(y - round(py * (grid.height - 1))).astype(np.float64)
        if grid.torus:
            dx = np.minimum(dx, grid.width - dx)
            dy = np.minimum(dy, grid.height - dy)
        nearest = np.minimum(nearest, np.sqrt(dx * dx + dy * dy))
    return np.maximum(top - np.floor(nearest / step), 0).astype(np.int16)


def regrow(level: np.ndarray, cap: np.ndarray, rate: int) -> np.ndarray:
    """Growback: each cell gains `rate` sugar, up to its capacity."""
    return np.minimum(level.astype(np.int64) + rate, cap).astype(level.dtype)


def settle(level: np.ndarray, cell: np.ndarray, wealth: np.ndarray, metabolism: np.ndarray,
           alive: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A round where each living agent stands: it harvests all the sugar of its cell and burns
    its metabolism. (level, wealth, the starved: living agents left with no sugar), new arrays."""
    living = np.flatnonzero(alive)
    at = cell[living]
    wealth = wealth.astype(np.int64)
    wealth[living] += level[at].astype(np.int64) - metabolism[living]
    level = level.copy()
    level[at] = 0
    return level, wealth, living[wealth[living] <= 0]


def sight(grid: Grid, cell: np.ndarray, vision: np.ndarray, level: np.ndarray, cap: np.ndarray,
          occupant: np.ndarray, rate: int, choices: int) -> tuple[np.ndarray, np.ndarray]:
    """What each agent (standing on `cell`, seeing `vision` cells along the four lattice
    directions) would move to: the free cells in sight with more sugar next round than its own
    cell will have (it harvests its own this round: `min(rate, capacity)`; a free cell grows back
    to `min(level + rate, capacity)`), the most first, the nearest on a tie, at most `choices`,
    then its own cell (staying). Returns (the cells, their sugar next round): shape (n, choices + 1),
    each row padded with -1 after its own cell. Vectorised: one pass per distinct vision."""
    cell = np.asarray(cell, dtype=np.int64)
    vision = np.asarray(vision, dtype=np.int64)
    grown = np.minimum(level.astype(np.int64) + rate, cap)
    free = np.asarray(occupant) == EMPTY
    out = np.full((cell.size, choices + 1), EMPTY, dtype=np.int64)
    worth = np.full((cell.size, choices + 1), EMPTY, dtype=np.int64)
    for v in np.unique(vision).tolist():
        rows = np.flatnonzero(vision == v)
        for part in np.array_split(rows, max(1, rows.size // 50_000)):
            here = cell[part]
            own = np.minimum(rate, cap[here]).astype(np.int64)

            def score(candidates: np.ndarray, own: np.ndarray = own) -> np.ndarray:
                s = grown[np.maximum(candidates, 0)]
                s[:, 0] = own  # its own cell: harvested this round, then grown back
                return s

            ranked = grid.ranked(here, score, radius=int(v), shape="cross", free=free, stay=True)
            # the cells before its own (strictly better: its own is the nearest of equals), at most `choices`
            k = np.minimum(np.argmax(ranked == here[:, None], axis=1), choices)
            cut = np.full((part.size, choices + 1), EMPTY, dtype=np.int64)
            head = ranked[:, :choices + 1]
            cut[:, :head.shape[1]] = head
            cut[np.arange(choices + 1)[None, :] >= k[:, None]] = EMPTY
            cut[np.arange(part.size), k] = here
            out[part] = cut
            worth[part] = np.where(cut == EMPTY, EMPTY, grown[np.maximum(cut, 0)])
            worth[part, k] = own
    return out, worth


def newcomers(rng: np.random.Generator, count: int, occupant: np.ndarray, traits: dict[str, tuple[int, int]]
              ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Up to `count` newcomers on free cells drawn with `rng` (fewer when fewer cells are free):
    (their cells, their traits drawn uniformly in each [low, high])."""
    free = np.flatnonzero(np.asarray(occupant) == EMPTY)
    n = min(count, free.size)
    cells = rng.choice(free, size=n, replace=False) if n else np.zeros(0, dtype=np.int64)
    drawn = {name: rng.integers(low, high + 1, size=n) for name, (low, high) in traits.items()}
    return cells.astype(np.int64), drawn


def gini(values: np.ndarray) -> float | None:
    """The Gini coefficient of non-negative values (None: none, or all zero), computed exactly
    (integers) then rounded once: the same on every process."""
    v = np.sort(np.asarray(values, dtype=np.int64))
    n = int(v.size)
    total = int(v.sum())
    if n == 0 or total == 0:
        return None
    ranked = int((np.arange(1, n + 1, dtype=np.int64) * v).sum())
    return float(Fraction(2 * ranked, n * total) - Fraction(n + 1, n))
