"""The public-goods game with punishment (Fehr & Gächter 2000) as a Populace simulation: groups
drawn again every round; in each group every member contributes to a multiplied pot, then,
seeing the others' contributions, assigns them costly punishment points — two ordered stages
inside one round (a scene)."""

from populace_punishment.simulation import Group, Move, Player, Punishment, PunishmentEnv, Result

__all__ = ["Group", "Move", "Player", "Punishment", "PunishmentEnv", "Result"]
