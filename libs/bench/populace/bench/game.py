"""The game the gateway and vLLM benches ask about: a simulation loaded by name through the
registry (as every service loads one), never imported, and spoken to only through the SDK.

Its system prompt and answer schema come from the simulation; a user prompt is the one its agent
asks (the agent's turn played against a port that keeps the prompt), and an answer is judged by
the agent's own parse (its turn played against a port that replies with the text), so the benches
measure exactly what a run would send and accept.
"""

from __future__ import annotations

from functools import cached_property

from populace.population.cast import Persona
from populace.sdk.registry import load_simulation

DEFAULT_SIMULATION = "ratio-game"  # the paper's game, which the benches' figures are quoted for
# Where a system prompt's JSON form starts: what the paper's free first call leaves out
# (its second call extracts the number instead).
JSON_FORM = " Answer with JSON only"


class _Port:
    """An LLM port for one turn: keeps the prompt the agent asked, replies with `reply`."""

    def __init__(self, reply: str = "") -> None:
        self.reply, self.prompt = reply, ""

    async def ask(self, prompt: str, *, key: int, prefix_chars: int = 0, system: str | None = None,
                  schema: dict | None = None) -> str:
        self.prompt = prompt
        return self.reply


class BenchGame:
    """One simulation at its default parameters, with `prompt` (e.g. {"answer": "cot"}) set."""

    def __init__(self, prompt: dict | None = None, simulation: str = DEFAULT_SIMULATION) -> None:
        cls = load_simulation(simulation)
        params = cls.Params.model_validate({"prompt": prompt} if prompt else {})
        self.cls = cls
        self.sim = cls(params, agents=1)

    @cached_property
    def system(self) -> str:
        return self.sim.system_prompt()

    @cached_property
    def schema(self) -> dict | None:
        return self.sim.answer_schema()

    @cached_property
    def free_system(self) -> str:
        """The system prompt without its JSON form: the paper's free answer."""
        return self.system.split(JSON_FORM)[0]

    def _turn(self, agent_id: int, persona: str | None, port: _Port):
        agent = self.cls.Agent(agent_id, Persona(agent_id, persona, {}) if persona else None, self.sim)
        return agent.turn(self.cls.Observation(round=1), port)

    def user_prompt(self, agent_id: int, persona: str | None = None) -> str:
        """What agent `agent_id` (with `persona`) asks in the first round."""
        port = _Port()
        _run(self._turn(agent_id, persona, port))
        return port.prompt

    def valid(self, text: str) -> bool:
        """Whether the simulation's agent accepts `text` as its answer."""
        return bool(_run(self._turn(0, None, _Port(text))).valid)

    def value(self, text: str):
        """The answer the agent reads from `text` (its outcome's `value`; None: invalid)."""
        outcome = _run(self._turn(0, None, _Port(text)))
        return getattr(outcome, "value", None) if outcome.valid else None


def _run(coro):
    """Play one turn to its end. A turn only awaits the port, which answers at once, so one
    step runs it through, inside or outside an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("the agent's turn awaited something other than its LLM port")
