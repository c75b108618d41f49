"""Moved to `populace.store.interview_tables` (the interviews' DDL belongs to the store the
recorder writes, not to the analysis above it); kept so that code importing the old name goes on
working."""

from populace.store.interview_tables import SCHEMA

__all__ = ["SCHEMA"]
