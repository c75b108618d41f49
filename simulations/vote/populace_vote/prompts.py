"""The vote's prompts and answer schema, as pure functions.

The *system* prompt is shared by every agent of a run (sent once per inference batch, so
replicas keep it in their prefix cache): the poll, the question, its options, optionally
that rounds repeat with last round's distribution shown, a note on the population's make-up,
and the answer instruction. The *user* prompt is per agent: its persona (first, and the same
every round, so it stays in the replica's prefix cache), last round's distribution when
shown, its own earlier answers, and the request.

Options are always shown in double quotes, exactly as the scenario wrote them, in the
ballot's order (the order is the researcher's to choose and the same for every agent).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from populace_vote.params import BallotConfig, PromptConfig

# Bump when any text below changes: the manifest records it with every run.
PROMPT_VERSION = "vote-v1"

POLL = "You are taking part in a poll together with many other people."
REPEATED = ("The poll is repeated over several rounds. From the second round on you hear how everyone "
            "answered in the round before, and you may keep or change your answer.")
SPEAK_AS_PERSONA = "Answer in the role of the person described to you, from their circumstances and views."

ANSWER_INSTRUCTIONS: dict[str, str] = {
    "direct": ('Choose exactly one option. Answer with JSON only, in the form '
               '{"choice": "<the option, exactly as written above>"}.'),
    "cot": ("Think step by step about the question from your own point of view before you choose exactly "
            'one option. Answer with JSON only, in the form {"reasoning": "<your step-by-step thinking>", '
            '"choice": "<the option, exactly as written above>"}.'),
}

USER_REQUESTS: dict[str, str] = {
    "direct": "Which option do you choose?",
    "cot": "Think step by step, then choose one option.",
}


def quoted(option: str) -> str:
    return json.dumps(option, ensure_ascii=False)


def percent(count: int, total: int) -> int:
    """count/total in whole percent, rounded half up in integers (no float rounding quirks)."""
    return (200 * count + total) // (2 * total)


def system_prompt(ballot: BallotConfig, prompt: PromptConfig | None = None, population_note: str = "",
                  persona: bool = False, rounds: int = 1) -> str:
    """`population_note`: the cast's note (shown when `prompt.population_note`); `persona`:
    whether the agents' prompts carry personas (then they are told to answer as that person);
    `rounds`: the run's rounds (a single round is never announced as repeated)."""
    prompt = prompt or PromptConfig()
    parts = [POLL, f"Question: {ballot.question}",
             "Options: " + ", ".join(quoted(o) for o in ballot.options) + "."]
    if ballot.show_distribution and rounds > 1:
        parts.append(REPEATED)
    if prompt.population_note and population_note:
        parts.append(population_note)
    if persona:
        parts.append(SPEAK_AS_PERSONA)
    parts.append(ANSWER_INSTRUCTIONS[prompt.answer])
    return " ".join(parts)


def distribution_text(counts: Mapping[str, int]) -> str:
    """Last round's valid answers as shares, in ballot order, e.g.
    'In the last round, 48 people answered validly: "yes" 52%, "no" 48%.' ('' when none did)."""
    n = sum(counts.values())
    if n == 0:
        return ""
    people = "1 person" if n == 1 else f"{n:,} people"
    shares = ", ".join(f"{quoted(o)} {percent(c, n)}%" for o, c in counts.items())
    return f"In the last round, {people} answered validly: {shares}."


def own_answers_text(memory: Iterable[tuple[int, str | None]]) -> str:
    """The agent's own valid answers of earlier rounds (its memory: (round, choice or None))."""
    shown = [f"round {r} {quoted(c)}" for r, c in memory if c is not None]
    return f"Your answers in earlier rounds: {', '.join(shown)}." if shown else ""


def user_prompt(persona: str | None, distribution: str, own: str, answer: str = "direct") -> str:
    """Persona first (constant per agent: the cacheable prefix), then what changes per round."""
    return " ".join(p for p in (persona, distribution, own, USER_REQUESTS[answer]) if p)


def answer_schema(options: tuple[str, ...], answer: str = "direct") -> dict:
    """One JSON object, one call per decision; the choice is constrained to the options. With
    chain of thought the reasoning comes first, so the model thinks before it commits."""
    choice = {"type": "string", "enum": list(options)}
    if answer == "cot":
        return {"type": "object", "properties": {"reasoning": {"type": "string"}, "choice": choice},
                "required": ["reasoning", "choice"], "additionalProperties": False}
    return {"type": "object", "properties": {"choice": choice}, "required": ["choice"],
            "additionalProperties": False}
