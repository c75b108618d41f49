"""Moved to `populace.store.snapshot` (the store library, owned by no service: docs/architecture.md);
kept so that code importing the old name goes on working."""

from populace.store.snapshot import *  # noqa: F403
