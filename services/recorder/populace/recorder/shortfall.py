"""Moved to `populace.store.shortfall` (the store library, owned by no service: docs/architecture.md);
kept so that code importing the old name goes on working."""

from populace.store.shortfall import *  # noqa: F403
