"""Moved to `populace.store.local_runs` (the store library, owned by no service: docs/architecture.md);
kept so that code importing the old name goes on working."""

from populace.store.local_runs import *  # noqa: F403
