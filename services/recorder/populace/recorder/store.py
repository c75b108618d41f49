"""Moved to `populace.store.store` (the store library, owned by no service: docs/architecture.md);
kept so that code importing the old name goes on working."""

from populace.store.store import *  # noqa: F403
