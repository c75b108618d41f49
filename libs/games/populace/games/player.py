"""The built-in game player: an ordinary Agent. Each agent runs its own turn — builds its
prompt, awaits its own answer, parses it, updates its memory."""

from __future__ import annotations

from dataclasses import dataclass

from populace.games.parsing import parse_guess
from populace.games.prompts import user_prompt
from populace.sdk.agent import Agent
from populace.sdk.llm import InferError, InferSession


@dataclass(slots=True)
class Turn:
    """What one round tells every agent on a host: one shared object, not one per agent."""

    round: int
    history_text: str
    max_value: float
    llm: InferSession
    answer: str = "direct"  # the prompt's answer style: "direct" or "cot"


class GuessPlayer(Agent):
    __slots__ = ()

    async def reply(self, turn: Turn) -> tuple[float | None, str]:
        # self.persona is the persona's background text, shared by reference (or None)
        persona = self.persona
        prompt = user_prompt(self.agent_id, turn.history_text, self.memory, persona, turn.answer)
        try:
            # the persona leads the prompt and is the same every round: the gateway keeps it
            # on one replica, whose prefix cache already holds it
            raw = await turn.llm.ask(self.agent_id, prompt, len(persona) if persona else 0)
        except InferError as err:
            raw = f"<no answer: {err}>"
            value = None
        else:
            value = parse_guess(raw, turn.max_value)
        self.remember((turn.round, value))
        return value, raw
