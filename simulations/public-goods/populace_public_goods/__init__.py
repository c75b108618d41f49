"""The public-goods game in groups (contributions, a multiplied pot shared equally): a Populace
simulation like any user's."""

from populace_public_goods.params import GameConfig, PromptConfig, PublicGoodsParams
from populace_public_goods.rules import GoodsPartial, GroupNews, RoundSummary
from populace_public_goods.simulation import Contribution, Contributor, Group, PublicGoods, PublicGoodsEnv

__all__ = ["Contribution", "Contributor", "GameConfig", "GoodsPartial", "Group", "GroupNews", "PromptConfig",
           "PublicGoods", "PublicGoodsEnv", "PublicGoodsParams", "RoundSummary"]
