"""Moved to `populace.store.prototypes` (the store library, owned by no service: docs/architecture.md);
kept so that code importing the old name goes on working."""

from populace.store.prototypes import *  # noqa: F403
