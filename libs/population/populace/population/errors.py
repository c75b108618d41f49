"""The one error the population library raises for a bad config."""

from __future__ import annotations


class PopulationError(ValueError):
    """A population config is invalid or unreadable.

    The message starts with the dotted path of the offending field, e.g.
    ``attributes.education.weights: weights must sum to 1 (got 0.9)``; several problems
    are reported one per line.
    """
