"""Epstein & Axtell's Sugarscape as a Populace simulation: agents with vision and metabolism
forage a landscape whose sugar grows back, move by exclusive claims on the cells in sight, starve
when their sugar runs out and, optionally, are replaced — by the classic movement rule, or as an
LLM decides among the best cells it sees."""

from populace_sugarscape.simulation import Forage, Forager, Landscape, Sight, Sugarscape, SugarscapeEnv

__all__ = ["Forage", "Forager", "Landscape", "Sight", "Sugarscape", "SugarscapeEnv"]
