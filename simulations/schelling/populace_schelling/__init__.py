"""Schelling's segregation model as a Populace simulation: agents of two (or more) kinds on a
grid; an agent with too few neighbours of its own kind moves to an empty cell — by the classic
rule, or as an LLM decides from what it sees."""

from populace_schelling.simulation import Resident, Schelling, SchellingEnv, Seen, Stay, Town

__all__ = ["Resident", "Schelling", "SchellingEnv", "Seen", "Stay", "Town"]
