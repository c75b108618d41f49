"""Populace SDK: Agent, Env and the batched transport agents use to reach the LLM gateway."""

from populace.sdk.agent import Agent
from populace.sdk.env import Env

__all__ = ["Agent", "Env"]
