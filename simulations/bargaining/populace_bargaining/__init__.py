"""Bargaining as a Populace simulation: pairs drawn again every round, in each pair two agents
split a pie by conversation — alternating messages, each saying something, proposing a split
and accepting or not the other's proposal — inside one round (a scene); the deal is read from
the transcript."""

from populace_bargaining.simulation import (
    Bargaining,
    BargainingEnv,
    Conversation,
    Negotiator,
    Result,
    Speech,
)

__all__ = ["Bargaining", "BargainingEnv", "Conversation", "Negotiator", "Result", "Speech"]
