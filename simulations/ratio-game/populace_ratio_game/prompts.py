"""The paper's prompt variants for the guess-the-ratio game, as pure functions.

The *system* prompt is shared by every agent of a run (sent once per inference batch, so
replicas keep it in their prefix cache): the rules, the variant family's sentence, an
optional note on the population's make-up, and the answer instruction. The *user* prompt is
per agent: its persona background, the previous winning numbers (a bounded window), its own
previous numbers, and the request.

Ratios are shown exactly as the scenario wrote them ("2/3", "51/100", "0.5").
"""

from __future__ import annotations

from populace_ratio_game.params import GameConfig, PromptConfig

# Bump when any text below changes: the manifest records it with every run.
PROMPT_VERSION = "ratio-game-v2"

SYSTEM_FAMILIES: dict[str, str] = {
    "basic": "",
    "rational": "All players are rational, and every player knows that all the others are rational too.",
    "strategies": ("Before you choose, consider what numbers the other players are likely to "
                   "report and why."),
    "variant": "This game is a variant of the well-known \"guess 2/3 of the average\" game.",
}

ANSWER_INSTRUCTIONS: dict[str, str] = {
    "direct": 'Report your number directly. Answer with JSON only, in the form {"guess": <number>}.',
    "cot": ("Think step by step about what the other players will do before you decide. "
            'Answer with JSON only, in the form {"reasoning": "<your step-by-step thinking>", '
            '"guess": <number>}.'),
}

USER_REQUESTS: dict[str, str] = {
    "direct": "Report your number.",
    "cot": "Think step by step, then report your number.",
}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def rules(game: GameConfig) -> str:
    target = f"{game.ratio} of the average of all numbers"
    if game.offset:
        target = f"{_num(game.offset)} plus {target}"
    return (
        "You are playing a game with many other players. Every player reports a number "
        f"between 0 and {_num(game.max_value)}. The winner is the player whose number is closest "
        f"to {target}."
    )


def system_prompt(game: GameConfig, prompt: PromptConfig | None = None, population_note: str = "") -> str:
    prompt = prompt or PromptConfig()
    parts = [rules(game), SYSTEM_FAMILIES[prompt.system]]
    if prompt.population_note and population_note:
        parts.append(population_note)
    parts.append(ANSWER_INSTRUCTIONS[prompt.answer])
    return " ".join(p for p in parts if p)


def user_prompt(agent_id: int, history_text: str, own: tuple, persona: str | None = None,
                answer: str = "direct") -> str:
    mine = ", ".join(_num(v) for _, v in own if v is not None)
    parts = [persona if persona else f"You are player {agent_id}."]
    if history_text:
        parts.append(f"Winning numbers of previous rounds: {history_text}.")
    if mine:
        parts.append(f"Your previous numbers: {mine}.")
    parts.append(USER_REQUESTS[answer])
    return " ".join(parts)


def answer_schema(game: GameConfig, answer: str = "direct") -> dict:
    """The structured answer every agent gives: one JSON object, one call per decision.
    With chain of thought the reasoning comes first, so the model thinks before it commits."""
    guess = {"type": "number", "minimum": 0, "maximum": game.max_value}
    if answer == "cot":
        return {
            "type": "object",
            "properties": {"reasoning": {"type": "string"}, "guess": guess},
            "required": ["reasoning", "guess"],
        }
    return {"type": "object", "properties": {"guess": guess}, "required": ["guess"]}


def history_text(history: list[float], window: int) -> str:
    shown = history[-window:] if window else []
    return ", ".join(_num(v) for v in shown)
