"""Moved to `populace.store.expected` (the store library, owned by no service: docs/architecture.md);
kept so that code importing the old name goes on working."""

from populace.store.expected import *  # noqa: F403
