"""Moved to `populace.store.profile`: where a run's rounds went is a plain SQL read the recorder
answers with, in the store library below the analysis (docs/architecture.md); kept so that code
importing the old name goes on working."""

from populace.store.profile import *  # noqa: F403
