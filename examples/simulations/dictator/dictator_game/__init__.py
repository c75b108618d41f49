"""The dictator game: a Populace simulation to copy (see docs/simulations.md)."""

from dictator_game.agent import Dictator, Gift, Heard, parse_gift
from dictator_game.env import DictatorEnv, Gifts, Past, RoundSummary
from dictator_game.params import DictatorParams
from dictator_game.simulation import DictatorGame

__all__ = ["Dictator", "DictatorEnv", "DictatorGame", "DictatorParams", "Gift", "Gifts", "Heard", "Past",
           "RoundSummary", "parse_gift"]
