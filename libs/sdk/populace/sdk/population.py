"""Populations that change: agents die, leave, are born or arrive during a run. An
environment's `decide` returns the round's `Changes` after its other values; every hook of the
environment reads who is alive as `self.population` (a `Population`). See
populace.population.living, where these live (the platform's services read them too), and
docs/populations.md."""

from populace.population.living import (
    ARRIVED,
    BORN,
    DIED,
    EVENTS,
    FRESH,
    GONE,
    LEFT,
    Birth,
    ChangeError,
    Changes,
    Delta,
    Population,
    combined_rows,
    scheduled,
)

__all__ = ["ARRIVED", "BORN", "DIED", "EVENTS", "FRESH", "GONE", "LEFT", "Birth", "ChangeError", "Changes", "Delta",
           "Population", "combined_rows", "scheduled"]
