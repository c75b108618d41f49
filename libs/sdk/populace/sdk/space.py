"""Space: a grid of cells for spatial models (Schelling, Sugarscape, NetLogo's patches) — Mesa's grid
API for this platform, as pure functions over numpy arrays, so it works on a world's columns on any
host and in `decide`.

    grid = Grid(1000, 1000, torus=True)
    grid.neighbours(cell)                      # the 8 Moore neighbours' cells (4 with moore=False)
    grid.neighbourhoods(cells)                 # (len(cells), 8) for many at once
    grid.empty_cells(occupant)                 # cells whose occupant is -1
    occupant, cell = grid.move_to_empty(movers, cell, occupant, rng)   # seeded, as Mesa's move_to_empty

Cells are numbered row by row: cell = y * width + x."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EMPTY = -1  # an occupant column's value for a cell nobody holds

_MOORE = ((-1, -1), (0, -1), (1, -1), (-1, 0), (1, 0), (-1, 1), (0, 1), (1, 1))
_VON_NEUMANN = ((0, -1), (-1, 0), (1, 0), (0, 1))


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

    def neighbourhoods(self, cells: np.ndarray, moore: bool = True) -> np.ndarray:
        """For each cell, its neighbours' cells, shape (n, 8) (or (n, 4)); off-grid: -1."""
        cells = np.asarray(cells, dtype=np.int64)
        x, y = cells % self.width, cells // self.width
        offsets = _MOORE if moore else _VON_NEUMANN
        out = np.empty((cells.size, len(offsets)), dtype=np.int64)
        for j, (dx, dy) in enumerate(offsets):
            nx, ny = x + dx, y + dy
            if self.torus:
                out[:, j] = (ny % self.height) * self.width + (nx % self.width)
            else:
                inside = (nx >= 0) & (nx < self.width) & (ny >= 0) & (ny < self.height)
                out[:, j] = np.where(inside, ny * self.width + nx, EMPTY)
        return out

    def neighbours(self, cell: int, moore: bool = True) -> list[int]:
        """One cell's neighbours (off-grid ones left out)."""
        return [int(c) for c in self.neighbourhoods(np.array([cell]), moore)[0] if c != EMPTY]

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
