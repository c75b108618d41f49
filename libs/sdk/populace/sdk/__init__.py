"""Populace SDK: everything a simulation author imports.

    from populace.sdk import Agent, Env, GroupEnv, Observation, Outcome, Params, Post, Simulation, Summary

A simulation declares its parameters, agent, environment (and optionally a group env),
outcome columns, observation and per-round summary; see docs/simulations.md. The platform
loads it by name (entry point `populace.simulations`) and runs it unchanged in one process
(`populace.sdk.local.run_local`) or on the fleet.
"""

from populace.core.contracts import Count, FiniteFloat, RunConfig
from populace.population.cast import Cast, Persona
from populace.sdk import select
from populace.sdk.agent import Agent
from populace.sdk.answers import answer_field, structured
from populace.sdk.claims import Claims
from populace.sdk.env import Env, GroupEnv, Listeners, Partial, State
from populace.sdk.llm import LLM, InferError, ModelUnavailable
from populace.sdk.local import LocalResult, run_local
from populace.sdk.mailroom import BROADCAST_AUTHOR
from populace.sdk.mock import DummyLLM, ScriptedLLM
from populace.sdk.outcome import Ids, Outcome
from populace.sdk.population import Birth, Changes, Population
from populace.sdk.post import Message, Post
from populace.sdk.registry import available, load_simulation, resolve
from populace.sdk.rng import stable_seed
from populace.sdk.rules import invariant
from populace.sdk.scene import Member, Scene, SceneError
from populace.sdk.simulation import Observation, Params, Simulation, SimulationError, Summary

__all__ = [
    "BROADCAST_AUTHOR",
    "LLM",
    "Agent",
    "Birth",
    "Cast",
    "Changes",
    "Claims",
    "Count",
    "DummyLLM",
    "Env",
    "FiniteFloat",
    "GroupEnv",
    "Ids",
    "InferError",
    "Listeners",
    "LocalResult",
    "Member",
    "Message",
    "ModelUnavailable",
    "Observation",
    "Outcome",
    "Params",
    "Partial",
    "Persona",
    "Population",
    "Post",
    "RunConfig",
    "Scene",
    "SceneError",
    "ScriptedLLM",
    "Simulation",
    "SimulationError",
    "State",
    "Summary",
    "answer_field",
    "available",
    "invariant",
    "load_simulation",
    "resolve",
    "run_local",
    "select",
    "stable_seed",
    "structured",
]
