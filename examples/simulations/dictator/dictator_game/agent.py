"""What one agent sees, says and returns: the observation, the prompts, the parser, the
outcome and the agent itself.

An agent is a small object (a host keeps up to a million of them in one process): no state
of its own beyond the SDK's bounded `memory`, no I/O but the one `llm.ask` per turn.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from populace.sdk import LLM, Agent, Observation, Outcome, answer_field, structured

if TYPE_CHECKING:
    from dictator_game.simulation import DictatorGame

# Bump when a prompt below changes: the run's manifest records it.
PROMPT_VERSION = "dictator-v1"


class Heard(Observation):
    """What every agent sees in a round (built once by the environment, shared by all).
    `round` comes from the base class."""

    last_average: float | None = None  # last round's average gift (None: round 1, or not shown)


class Gift(Outcome):
    """One row per agent per round in table `dictator_outcomes` (the platform adds run_id,
    round, agent_id, valid, raw, latency_ms and error).

    Every field needs a default: the defaults are what a failed turn records (an agent whose
    code raised, or whose model could not be reached), so `given` stays None there."""

    given: int | None = None  # None when the answer was not a valid gift (`raw` keeps the text)
    measure = "given"  # the column reports summarise


def system_prompt(endowment: int) -> str:
    """Shared by every agent of a run: replicas keep it in their prefix cache. (With `model:
    {answer: cot}` the platform adds its own chain-of-thought sentence after it.)"""
    return (f"You have been given {endowment} coins. You may give any whole number of them, from 0 to "
            f"{endowment}, to another participant, an anonymous stranger you will never meet. You keep "
            'the rest. The stranger has no say. Answer with JSON only: {"give": <coins>}.')


def user_prompt(agent_id: int, persona: str | None, last_average: float | None, own: tuple) -> str:
    """Per agent: the persona leads (it is the same every round, so it is the cacheable prefix),
    then what this agent heard and remembers."""
    parts = [persona or f"You are participant {agent_id}."]
    if last_average is not None:
        parts.append(f"Last round, participants gave {last_average:.1f} coins on average.")
    mine = [str(g) for _, g in own if g is not None]
    if mine:
        parts.append(f"Your earlier gifts: {', '.join(mine)}.")
    parts.append("How many coins do you give?")
    return " ".join(parts)


def answer_schema(endowment: int) -> dict:
    """The answer every agent must give, one JSON object. Replicas that support structured output
    enforce it; the dummy model draws from it. (With `model: {answer: cot}` the platform puts a
    "reasoning" field first, so the model thinks before it commits; `parse_gift` reads "give" only.)"""
    return structured({"give": {"type": "integer", "minimum": 0, "maximum": endowment}})


_INTEGER = re.compile(r"[0-9]+")


def parse_gift(text: str, endowment: int) -> int | None:
    """`{"give": 30}` (or a bare `30`) → 30. Never invents an answer: prose, a fraction, a
    number out of range or a missing key is None (invalid), and the caller keeps the text."""
    value = answer_field(text, "give")  # the JSON field's value, or a bare answer's text
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 30.0 is 30; 12.5 stays invalid (not rounded)
    elif isinstance(value, str) and _INTEGER.fullmatch(value) and len(value) <= 18:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= endowment:
        return None
    return value


class Dictator(Agent):
    """One decision per round: build the prompt, ask once, parse, remember."""

    __slots__ = ()  # no per-agent attributes beyond the SDK's (id, persona, sim, memory)
    memory_size = 3  # the agent's own last gifts; saved by checkpoints with `memory`

    async def turn(self, obs: Heard, llm: LLM) -> Gift:
        sim: DictatorGame = self.sim  # the run (its params), shared by reference by every agent
        persona = self.persona.text if self.persona is not None and sim.use_persona else None
        prompt = user_prompt(self.id, persona, obs.last_average, self.memory)
        # key: the agent's id (seeds its sampling, keeps it on one replica); prefix_chars: how much
        # of the prompt is the same every round (the persona), for the replica's prefix cache
        raw = await llm.ask(prompt, key=self.id, prefix_chars=len(persona) if persona else 0)
        given = parse_gift(raw, sim.endowment)
        self.remember((obs.round, given))
        # When no model answers, `ask` raises InferError after its own retries. Do not catch
        # it: the platform stops the round and pauses the run; it is never this agent's answer.
        return Gift(given=given, raw=raw, valid=given is not None)
