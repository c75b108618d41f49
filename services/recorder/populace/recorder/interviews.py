"""Moved to `populace.store.interviews` (the store library, owned by no service: docs/architecture.md);
kept so that code importing the old name goes on working."""

from populace.store.interviews import *  # noqa: F403
