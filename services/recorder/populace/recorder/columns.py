"""Moved to `populace.store.columns` (the store library, owned by no service: docs/architecture.md);
kept so that code importing the old name goes on working."""

from populace.store.columns import *  # noqa: F403
