"""Space: a grid of cells for spatial models (Schelling, Sugarscape, NetLogo's patches) — Mesa's grid
API for this platform, as pure functions over numpy arrays, so it works on a world's columns on any
host and in `decide`.

    grid = Grid(1000, 1000, torus=True)
    grid.neighbours(cell)                      # the 8 Moore neighbours' cells (4 with moore=False)
    grid.neighbourhoods(cells)                 # (len(cells), 8) for many at once
    grid.neighbourhoods(cells, radius=3, shape="von_neumann")   # within 3 steps: (n, 24)
    grid.neighbourhoods(cells, radius=6, shape="cross")         # Sugarscape's vision: 6 along each axis
    grid.line_of_sight(origins, targets, opaque)                # whether nothing opaque stands between
    grid.ranked(cells, score, radius=6, shape="cross", free=occupant == EMPTY)  # best cells first
    grid.empty_cells(occupant)                 # cells whose occupant is -1
    occupant, cell = grid.move_to_empty(movers, cell, occupant, rng)   # seeded, as Mesa's move_to_empty
    cell, occupant = grid.move(cell, occupant, agents, targets)        # e.g. what claims granted
    grid.misplaced(cell, occupant)             # a witness for "each agent on its own cell" (None: holds)

Cells are numbered row by row: cell = y * width + x. Shapes: "moore" (the square around a cell:
Chebyshev distance <= radius), "von_neumann" (the diamond: Manhattan distance <= radius), "cross"
(the four lattice directions only, as far as radius: Sugarscape's vision). On a torus a
neighbourhood may not wrap onto itself: 2 * radius + 1 must not exceed the width or height."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np

EMPTY = -1  # an occupant column's value for a cell nobody holds

_MOORE = ((-1, -1), (0, -1), (1, -1), (-1, 0), (1, 0), (-1, 1), (0, 1), (1, 1))
_VON_NEUMANN = ((0, -1), (-1, 0), (1, 0), (0, 1))
Shape = Literal["moore", "von_neumann", "cross"]
SHAPES = ("moore", "von_neumann", "cross")


@lru_cache(maxsize=64)
def offsets(radius: int = 1, shape: Shape = "moore") -> tuple[tuple[int, int], ...]:
    """The (dx, dy) of a cell's neighbours within `radius` in `shape`, row by row (dy, then dx),
    the cell itself left out: radius 1 gives Mesa's Moore (8) and von Neumann (4) neighbourhoods."""
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r}: one of {', '.join(SHAPES)}")
    if not isinstance(radius, int) or isinstance(radius, bool) or radius < 1:
        raise ValueError(f"radius: a whole number >= 1, not {radius!r}")
    r = range(-radius, radius + 1)
    keep = {"moore": lambda dx, dy: True, "von_neumann": lambda dx, dy: abs(dx) + abs(dy) <= radius,
            "cross": lambda dx, dy: dx == 0 or dy == 0}[shape]
    return tuple((dx, dy) for dy in r for dx in r if (dx or dy) and keep(dx, dy))


def distances(radius: int = 1, shape: Shape = "moore") -> np.ndarray:
    """Each of `offsets(radius, shape)`'s distance from the cell, in steps of that shape
    (Chebyshev for moore, Manhattan for von_neumann and cross)."""
    d = np.asarray(offsets(radius, shape), dtype=np.int64)
    return np.abs(d).max(axis=1) if shape == "moore" else np.abs(d).sum(axis=1)


@dataclass(frozen=True)
class Grid:
    width: int
    height: int
    torus: bool = True  # edges wrap around; otherwise a border cell has fewer neighbours (-1 pads)

    def __post_init__(self) -> None:
        for name in ("width", "height"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"grid {name}: a whole number >= 1, not {v!r}")

    @property
    def cells(self) -> int:
        return self.width * self.height

    def xy(self, cell: int | np.ndarray) -> tuple:
        return np.asarray(cell) % self.width, np.asarray(cell) // self.width

    def cell(self, x: int | np.ndarray, y: int | np.ndarray) -> int | np.ndarray:
        return np.asarray(y) * self.width + np.asarray(x)

    def neighbourhoods(self, cells: np.ndarray, moore: bool = True, radius: int = 1,
                       shape: Shape | None = None) -> np.ndarray:
        """For each cell, its neighbours' cells within `radius` in `shape` (default: "moore", or
        "von_neumann" with moore=False), in the order of `offsets(radius, shape)`: shape (n, 8) for
        Moore's radius 1, (n, 4) for von Neumann's; off-grid: -1."""
        cells = np.asarray(cells, dtype=np.int64)
        x, y = cells % self.width, cells // self.width
        shape = shape or ("moore" if moore else "von_neumann")
        if radius == 1 and shape != "cross":
            steps = _MOORE if shape == "moore" else _VON_NEUMANN
        else:
            self._fits(radius)
            steps = offsets(radius, shape)
        out = np.empty((cells.size, len(steps)), dtype=np.int64)
        for j, (dx, dy) in enumerate(steps):
            nx, ny = x + dx, y + dy
            if self.torus:
                out[:, j] = (ny % self.height) * self.width + (nx % self.width)
            else:
                inside = (nx >= 0) & (nx < self.width) & (ny >= 0) & (ny < self.height)
                out[:, j] = np.where(inside, ny * self.width + nx, EMPTY)
        return out

    def _fits(self, radius: int) -> None:
        if self.torus and 2 * radius + 1 > min(self.width, self.height):
            raise ValueError(f"radius {radius}: on a {self.width}×{self.height} torus a neighbourhood that wide wraps "
                             "onto itself (2 * radius + 1 must not exceed the width or height)")

    def neighbours(self, cell: int, moore: bool = True, radius: int = 1, shape: Shape | None = None) -> list[int]:
        """One cell's neighbours (off-grid ones left out)."""
        return [int(c) for c in self.neighbourhoods(np.array([cell]), moore, radius, shape)[0] if c != EMPTY]

    def line_of_sight(self, origins: np.ndarray, targets: np.ndarray, opaque: np.ndarray) -> np.ndarray:
        """For each pair (origin cell, target cell), whether no opaque cell stands strictly between
        them (`opaque`: a bool per cell). The line is a DDA: one cell per step along the longer axis,
        the one the segment between the two centres passes nearest (halves rounded up), in integer
        arithmetic, so every process draws the same line. On a torus the shorter way round is taken.
        Vectorised over the pairs: one pass per step of the longest line."""
        o = np.asarray(origins, dtype=np.int64).reshape(-1)
        t = np.asarray(targets, dtype=np.int64).reshape(-1)
        if o.size != t.size:
            raise ValueError(f"line_of_sight: {o.size} origins but {t.size} targets")
        opaque = np.asarray(opaque, dtype=bool)
        if opaque.shape != (self.cells,):
            raise ValueError(f"line_of_sight: opaque is one bool per cell ({self.cells}), not shape {opaque.shape}")
        w, h = self.width, self.height
        ox, oy = o % w, o // w
        dx, dy = t % w - ox, t // w - oy
        if self.torus:  # the shorter way round
            dx = (dx + w // 2) % w - w // 2
            dy = (dy + h // 2) % h - h // 2
        steps = np.maximum(np.abs(dx), np.abs(dy))
        seen = np.ones(o.size, dtype=bool)
        for s in range(1, int(steps.max(initial=0))):
            on = steps > s
            if not on.any():
                break
            n = steps[on]
            # round(d * s / n), halves up, in integers: floor((2 d s + n) / 2n)
            x = ox[on] + (2 * dx[on] * s + n) // (2 * n)
            y = oy[on] + (2 * dy[on] * s + n) // (2 * n)
            cells = (y % h) * w + (x % w)  # inside the box of a non-torus line: no wrap happens
            seen[np.flatnonzero(on)[opaque[cells]]] = False
        return seen

    def ranked(self, cells: np.ndarray, score: np.ndarray | Callable[[np.ndarray], np.ndarray], radius: int = 1,
               shape: Shape = "moore", free: np.ndarray | None = None, stay: bool = False) -> np.ndarray:
        """For each cell in `cells` (where each agent stands), the cells within `radius` in `shape`,
        best first: the highest `score`, then the nearest, then in the order of `offsets`; cells
        not `free` (a bool per cell) and off-grid ones left out. `score`: one value per cell, or a
        function of the candidates (an (n, k) array of cells, -1 off-grid; with `stay` its first
        column is each agent's own cell, then the columns of `offsets`) giving a value for each,
        for a score that depends on the agent. `stay`: the agent's own cell is a candidate too
        (nearest of all, whatever `free` says). Shape (n, k), each row padded with -1: rows ready
        for `Claims.ranked` (Sugarscape's movement rule is `ranked(cell, sugar, vision, "cross",
        free=occupant == EMPTY, stay=True)`). Vectorised."""
        cells = np.asarray(cells, dtype=np.int64).reshape(-1)
        hoods = self.neighbourhoods(cells, radius=radius, shape=shape)
        dist = np.broadcast_to(distances(radius, shape), hoods.shape)
        if stay:
            hoods = np.concatenate([cells[:, None], hoods], axis=1)
            dist = np.concatenate([np.zeros((cells.size, 1), dtype=np.int64), dist], axis=1)
        ok = hoods != EMPTY
        if free is not None:
            ok &= np.asarray(free, dtype=bool)[np.maximum(hoods, 0)]
            if stay:
                ok[:, 0] = True
        value = np.asarray(score(hoods)) if callable(score) else np.asarray(score)[np.maximum(hoods, 0)]
        order = np.broadcast_to(np.arange(hoods.shape[1]), hoods.shape)
        # left out last, then the highest score, the nearest, the order of offsets
        by = np.lexsort((order, dist, -value.astype(np.float64), ~ok), axis=1)
        out = np.take_along_axis(np.where(ok, hoods, EMPTY), by, axis=1)
        width = int(ok.sum(axis=1).max(initial=0))
        return out[:, :width]

    def move(self, cell: np.ndarray, occupant: np.ndarray, agents: np.ndarray,
             targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Agents `agents[i]` move to cells `targets[i]` (e.g. a grant of claims, whose targets were
        free): (new cell, new occupant), as new arrays. Their old cells are left empty."""
        agents = np.asarray(agents, dtype=np.int64)
        targets = np.asarray(targets, dtype=np.int64)
        cell = np.array(cell, copy=True)
        occupant = np.array(occupant, copy=True)
        occupant[cell[agents]] = EMPTY
        cell[agents] = targets
        occupant[targets] = agents
        return cell, occupant

    def misplaced(self, cell: np.ndarray, occupant: np.ndarray, alive: np.ndarray | None = None) -> str | None:
        """A witness for the invariant "each (living) agent on its own cell, and each cell's
        occupant the agent standing there" (populace.sdk.rules): None when it holds, else the
        first cell where it does not and why. Vectorised."""
        cell = np.asarray(cell, dtype=np.int64)
        occupant = np.asarray(occupant, dtype=np.int64)
        who = np.arange(cell.size) if alive is None else np.flatnonzero(np.asarray(alive))
        at = cell[who]
        off = (at < 0) | (at >= self.cells)
        if off.any():
            a = int(who[off][0])
            return f"agent {a} stands on cell {int(cell[a])}, which is not on the {self.width}×{self.height} grid"
        order = np.argsort(at, kind="stable")
        s = at[order]
        same = np.flatnonzero(s[1:] == s[:-1])
        if same.size:
            c = int(s[same[0]])
            holders = who[order][s == c].tolist()
            return f"cell {c} holds agents {', '.join(map(str, holders[:5]))}"
        wrong = occupant[at] != who
        if wrong.any():
            a = int(who[wrong][0])
            return f"agent {a} stands on cell {int(cell[a])}, whose occupant is {int(occupant[cell[a]])}"
        listed = np.flatnonzero(occupant != EMPTY)
        stray = np.ones(listed.size, dtype=bool)
        stray[np.searchsorted(listed, np.sort(at))] = False  # every agent's cell is listed (checked above)
        if stray.any():
            c = int(listed[stray][0])
            return f"cell {c}'s occupant is {int(occupant[c])}, who does not stand there"
        return None

    def empty_cells(self, occupant: np.ndarray) -> np.ndarray:
        return np.flatnonzero(np.asarray(occupant) == EMPTY)

    def like_neighbours(self, cells: np.ndarray, kind: np.ndarray, occupant: np.ndarray,
                        moore: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """For agents standing on `cells` with kinds `kind` (per agent: kind_of = kind[occupant]),
        (neighbours of the same kind, occupied neighbours), each per agent."""
        hoods = self.neighbourhoods(cells, moore)
        who = np.where(hoods == EMPTY, EMPTY, np.asarray(occupant)[np.maximum(hoods, 0)])
        here = np.asarray(kind)[np.asarray(occupant)[np.asarray(cells)]]
        occupied = who != EMPTY
        same = occupied & (np.asarray(kind)[np.maximum(who, 0)] == here[:, None])
        return same.sum(axis=1), occupied.sum(axis=1)

    def move_to_empty(self, movers: np.ndarray, cell: np.ndarray, occupant: np.ndarray,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Move each of `movers` (agent ids, in this order) to an empty cell drawn with `rng`
        among the cells empty once the movers left: (new occupant, new cell), as new arrays.
        With fewer empty cells than movers, the ones left over stay where they were."""
        movers = np.asarray(movers, dtype=np.int64)
        cell = np.array(cell, copy=True)
        occupant = np.array(occupant, copy=True)
        if movers.size == 0:
            return occupant, cell
        occupant[cell[movers]] = EMPTY
        free = self.empty_cells(occupant)
        take = min(movers.size, free.size)
        chosen = rng.choice(free, size=take, replace=False) if take else np.empty(0, dtype=np.int64)
        moving = movers[:take]
        cell[moving] = chosen
        occupant[chosen] = moving
        staying = movers[take:]
        occupant[cell[staying]] = staying  # no room: back where they stood
        return occupant, cell
