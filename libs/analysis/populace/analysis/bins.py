"""Moved to `populace.store.bins` (the report's figures and the run page's live distribution draw
the same bins; the store, below the analysis, answers the latter: docs/architecture.md); kept so
that code importing the old name goes on working."""

from populace.store.bins import *  # noqa: F403
