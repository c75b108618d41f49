"""The public-goods game's prompts, as pure functions.

The *system* prompt is shared by every agent of a run (sent once per inference batch, so
replicas keep it in their prefix cache): the rules, an optional note on the population's
make-up, and the answer instruction. The *user* prompt is per agent: its persona (or its
player number), a note when its group is smaller than the others, its own past rounds
(contribution, payoff, its group's average contribution), and the request.
"""

from __future__ import annotations

from collections.abc import Sequence

from populace_public_goods.params import GameConfig, PromptConfig

# Bump when any text below changes: the manifest records it with every run.
PROMPT_VERSION = "public-goods-v1"

USER_REQUESTS: dict[str, str] = {
    "direct": "How many tokens do you contribute this round?",
    "cot": "Think step by step, then decide how many tokens you contribute this round.",
}


def num(x: float) -> str:
    """2 → '2', 1.6 → '1.6', 26.666… → '26.67': what a person would write."""
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}".rstrip("0").rstrip(".")


def rules(game: GameConfig) -> str:
    e = game.endowment
    return (
        f"You are playing a public-goods game in groups of {game.group_size} players, over several rounds. "
        f"Every round, each player receives {e} tokens and decides how many of them to contribute to "
        f"the group's common pot: a whole number from 0 to {e}; the player keeps the rest. The pot is "
        f"multiplied by {num(game.multiplier)} and shared equally among all players of the group, whatever "
        "each of them contributed. A player's payoff for the round is the tokens they kept plus their "
        "share of the pot."
    )


def answer_instruction(game: GameConfig, answer: str) -> str:
    e = game.endowment
    if answer == "cot":
        return ("Think step by step about what the other players of your group will do before you decide. "
                'Answer with JSON only, in the form {"reasoning": "<your step-by-step thinking>", '
                f'"contribution": <whole number from 0 to {e}>}}.')
    return f'Answer with JSON only, in the form {{"contribution": <whole number from 0 to {e}>}}.'


def system_prompt(game: GameConfig, prompt: PromptConfig | None = None, population_note: str = "") -> str:
    prompt = prompt or PromptConfig()
    parts = [rules(game)]
    if prompt.population_note and population_note:
        parts.append(population_note)
    parts.append(answer_instruction(game, prompt.answer))
    return " ".join(parts)


def intro(agent_id: int, persona: str | None = None, group_size: int | None = None) -> str:
    """The part of the user prompt that is the same every round (its length is the prompt's
    cacheable prefix). `group_size`: the agent's group's size when it differs from the rules'."""
    who = persona if persona else f"You are player {agent_id}."
    if group_size is None:
        return who
    if group_size == 1:
        return f"{who} You are alone in your group, so the whole multiplied pot is yours."
    return f"{who} Your group has only {group_size} players, so its pot is shared among {group_size}."


def past_round(item: Sequence) -> str:
    """One remembered round: (round, contribution or None, payoff, group's average)."""
    round_, contribution, payoff, average = item
    gave = ("you gave no valid answer (counted as 0)" if contribution is None
            else f"you contributed {contribution}")
    return (f"round {round_}: {gave}, your payoff was {num(payoff)}, "
            f"your group's average contribution was {num(average)}")


def user_prompt(lead: str, memory: Sequence[Sequence], window: int, answer: str = "direct") -> str:
    """`lead` from `intro`; `memory` the agent's remembered rounds, oldest first (the last
    `window` are shown)."""
    parts = [lead]
    shown = memory[-window:] if window else ()
    if shown:
        parts.append("Your previous rounds: " + "; ".join(past_round(m) for m in shown) + ".")
    parts.append(USER_REQUESTS[answer])
    return " ".join(parts)


def answer_schema(game: GameConfig, answer: str = "direct") -> dict:
    """The structured answer every agent gives: one JSON object, one call per decision. With
    chain of thought the reasoning comes first, so the model thinks before it commits."""
    contribution = {"type": "integer", "minimum": 0, "maximum": game.endowment}
    if answer == "cot":
        return {
            "type": "object",
            "properties": {"reasoning": {"type": "string"}, "contribution": contribution},
            "required": ["reasoning", "contribution"],
        }
    return {"type": "object", "properties": {"contribution": contribution}, "required": ["contribution"]}
