"""Moved to `populace.store.live`: the run page's live reads (a page of agents, a round's
distribution) are plain SQL the recorder answers with, in the store library below the analysis
(docs/architecture.md); kept so that code importing the old name goes on working."""

from populace.store.live import *  # noqa: F403
