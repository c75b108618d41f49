"""The guess-the-ratio game (Pan et al., 2024): a Populace simulation like any user's."""

from populace_ratio_game.params import GameConfig, PromptConfig, RatioParams, parse_ratio
from populace_ratio_game.simulation import Guess, History, Player, RatioEnv, RatioGame, Seen

__all__ = ["GameConfig", "Guess", "History", "Player", "PromptConfig", "RatioEnv", "RatioGame", "RatioParams",
           "Seen", "parse_ratio"]
