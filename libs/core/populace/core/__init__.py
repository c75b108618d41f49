"""Populace core: wire contracts, subject names, settings, bus helpers, telemetry.

`core` imports no other Populace library: every other package builds on it.
"""
