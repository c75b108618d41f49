"""Prompts for the guess-the-ratio game. The system prompt is shared by every agent of a
round (sent once per inference batch, a common prefix); the user prompt is per agent."""

from __future__ import annotations

from populace.core.contracts import GameConfig

PROMPT_VERSION = "basic-v1"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def system_prompt(game: GameConfig) -> str:
    target = f"{game.ratio} of the average of all numbers"
    if game.offset:
        target = f"{_num(game.offset)} plus {target}"
    return (
        "You are playing a game with many other players. Every player reports a number "
        f"between 0 and {_num(game.max_value)}. The winner is the player whose number is closest "
        f"to {target}. "
        'Answer with JSON only, in the form {"guess": <number>}.'
    )


def user_prompt(agent_id: int, history_text: str, own: tuple) -> str:
    mine = ", ".join(_num(v) for _, v in own if v is not None)
    parts = [f"You are player {agent_id}."]
    if history_text:
        parts.append(f"Winning numbers of previous rounds: {history_text}.")
    if mine:
        parts.append(f"Your previous numbers: {mine}.")
    parts.append("Report your number.")
    return " ".join(parts)


def answer_schema(game: GameConfig) -> dict:
    """The structured answer every agent gives: one JSON object, one call per decision."""
    return {
        "type": "object",
        "properties": {"guess": {"type": "number", "minimum": 0, "maximum": game.max_value}},
        "required": ["guess"],
    }


def history_text(history: list[float], window: int) -> str:
    shown = history[-window:] if window else []
    return ", ".join(_num(v) for v in shown)
