"""The ultimatum game as a Populace simulation: pairs drawn again every round, in each pair a
proposer offers a split of the pie and the responder accepts or rejects it — two ordered acts
inside one round (a scene)."""

from populace_ultimatum.simulation import Move, Pair, Result, Trader, Ultimatum, UltimatumEnv

__all__ = ["Move", "Pair", "Result", "Trader", "Ultimatum", "UltimatumEnv"]
