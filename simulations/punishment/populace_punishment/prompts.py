"""What the players read, as pure functions. The system prompt (the rules) is shared by every
call of a run, so replicas cache it; the user prompt carries the agent's persona, its last
rounds and this act's question: its contribution (stage 1), or its punishment points after
seeing the others' contributions (stage 2). The others are named by letters (A, B, …) in the
group's order, the letters its answer uses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from populace_punishment.params import LABELS, GameConfig
from populace_punishment.rules import Terms, first_stage, payoff

PROMPT_VERSION = "punishment-1"
CACHED_PARTS = 1 << 16  # prompt parts a process keeps (see Texts.punish)
T = TypeVar("T")


def num(x: float) -> str:
    """2 → '2', 1.6 → '1.6', 26.666… → '26.67', -3.5 → '-3.5': what a person would write."""
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}".rstrip("0").rstrip(".")


def tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


def points(n: int) -> str:
    return f"{n} point" if n == 1 else f"{n} points"


def system_prompt(game: GameConfig) -> str:
    k, e = game.group_size, game.endowment
    groups = (f"in a fixed group of {k} players (the same players every round)" if game.block == k
              else f"in groups of {k} players drawn again every round (you rarely meet the same players twice)")
    pot = (f"every player receives {e} tokens and contributes a whole number of them, from 0 to {e}, to the "
           f"group's pot, keeping the rest. The pot is multiplied by {num(game.multiplier)} and shared equally "
           "among the group's players, whatever each contributed.")
    if game.max_points == 0:
        return (f"You play a public-goods game {groups}, over several rounds. Every round, {pot} A player's payoff "
                "for the round is the tokens kept plus the share of the pot. Answer with JSON only.")
    return (f"You play a public-goods game with punishment {groups}, over several rounds. Each round has two "
            f"stages. Stage 1: {pot} Stage 2: every player sees what the others contributed and may assign each "
            f"of them from 0 to {game.max_points} punishment points. Each point costs the player who assigns it "
            f"{tokens(game.cost)} and the player who receives it {tokens(game.fine)}. A player's payoff for the "
            "round is the tokens kept, plus the share of the pot, minus the cost of the points assigned, minus "
            f"{tokens(game.fine)} per point received. Answer with JSON only.")


def _gave(contribution: int | None) -> str:
    return "gave no valid answer (counted as 0)" if contribution is None else f"contributed {contribution}"


def history_text(memory: Sequence[tuple], terms: Terms, punishing: bool) -> str:
    """An agent's remembered rounds: (round, its contribution or None, its group's total, the
    group's size, points it assigned, points it received); the payoff follows from the rules."""
    if not memory:
        return ""
    lines = []
    for round_, contribution, total, size, given, received in memory:
        got = payoff(terms, contribution, total, size, given, received)
        group = "you were alone" if size == 1 else f"your group of {size} put in {total} in all"
        punished = f"; you assigned {points(given)} and received {received}" if punishing and size > 1 else ""
        lines.append(f"- round {round_}: you {_gave(contribution)}, {group}{punished}; your payoff was {num(got)}.")
    return "Your last rounds:\n" + "\n".join(lines) + "\n"


def size_note(size: int, group_size: int, punishing: bool = True) -> str:
    if size == 1:
        return ("You are alone in your group this round: the whole multiplied pot is yours"
                + (", and there is nobody to punish. " if punishing else ". "))
    if size < group_size:
        return f"Your group has only {size} players this round, so its pot is shared among {size}. "
    return ""


def contribute_ask(endowment: int, cot: bool) -> str:
    answer = ('Think step by step, then answer {"reasoning": "...", "contribution": n}.' if cot
              else 'Answer {"contribution": n}.')
    return f"Stage 1: how many of your {endowment} tokens do you contribute to the pot? {answer}"


def punish_ask(others: int, terms: Terms, max_points: int, cot: bool) -> str:
    """Stage 2's question to a member with `others` others (named A, B, …)."""
    labels = LABELS[:others]
    named = labels[0] if others == 1 else "each of " + ", ".join(labels[:-1]) + f" and {labels[-1]}"
    fields = ", ".join(f'"{label}": n' for label in labels)
    answer = f'Think step by step, then answer {{"reasoning": "...", {fields}}}.' if cot else f"Answer {{{fields}}}."
    return (f"Stage 2: how many punishment points (0 to {max_points}) do you assign to {named}? Each point costs "
            f"you {tokens(terms.cost)} and its receiver {tokens(terms.fine)}. {answer}")


class Texts:
    """A run's user prompts. What every call of a kind shares (the question, the prices) is
    written once per run: a round asks it twice per agent, a million agents a round."""

    def __init__(self, terms: Terms, group_size: int, max_points: int, cot: bool) -> None:
        self.terms = terms
        self.group_size = group_size
        self.punishing = max_points > 0
        self._multiplier = num(float(terms.multiplier))
        self._contribute = contribute_ask(terms.endowment, cot)
        self._notes = [size_note(k, group_size, self.punishing) for k in range(group_size + 1)]
        self._punish = [punish_ask(n, terms, max_points, cot) if n else "" for n in range(group_size)]
        self._seen: dict[tuple, tuple[str, int]] = {}  # others' contributions -> (their text, their sum)
        self._pot: dict[tuple, str] = {}  # (own contribution, pot, size) -> the rest of the prompt

    def history(self, memory: Sequence[tuple]) -> str:
        return history_text(memory, self.terms, self.punishing)

    def contribute(self, persona: str | None, history: str, size: int) -> str:
        """Stage 1's prompt to a member of a group of `size`."""
        lead = f"{persona}\n" if persona else ""
        return f"{lead}{history}{self._notes[size]}{self._contribute}"

    def punish(self, persona: str | None, history: str, mine: int | None, others: Sequence[int | None]) -> str:
        """Stage 2's prompt: `mine` the member's own valid contribution, `others` the other
        members' (None: invalid, counted as 0), in the group's order, which the letters name.
        Made of parts a round repeats (what the others gave; the pot and what the member holds),
        each written once per process and then looked up: a million members ask it every round."""
        lead = f"{persona}\n" if persona else ""
        key = others if others.__class__ is tuple else tuple(others)
        seen = self._seen.get(key)
        if seen is None:
            seen = self._keep(self._seen, key, (
                ", ".join(f"{label} {'no valid answer (counted as 0)' if c is None else c}"
                          for label, c in zip(LABELS, others)),
                sum(c or 0 for c in others)))
        total = (mine or 0) + seen[1]
        size = len(others) + 1
        pot = self._pot.get((mine, total, size))
        if pot is None:
            pot = self._keep(self._pot, (mine, total, size), self._pot_text(mine, total, size))
        return f"{lead}{history}Stage 1 is over: you {_gave(mine)}; the others contributed: {seen[0]}{pot}"

    def _pot_text(self, mine: int | None, total: int, size: int) -> str:
        m = self.terms.multiplier
        share = m.numerator * total / (m.denominator * size)  # correctly rounded, without a Fraction
        held = first_stage(self.terms, mine, total, size)
        return (f". The pot of {tokens(total)}, multiplied by {self._multiplier}, gives each player {num(share)}, "
                f"so you hold {num(held)}.\n{self._punish[size - 1]}")

    @staticmethod
    def _keep(cache: dict, key: object, value: T) -> T:
        if len(cache) >= CACHED_PARTS:  # bounded: a huge endowment or group cannot grow it for ever
            cache.clear()
        cache[key] = value
        return value


def _schema(props: dict, cot: bool) -> dict:
    props = {"reasoning": {"type": "string"}, **props} if cot else props
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def contribute_schema(endowment: int, cot: bool) -> dict:
    return _schema({"contribution": {"type": "integer", "minimum": 0, "maximum": endowment}}, cot)


def punish_schema(others: int, max_points: int, cot: bool) -> dict:
    """One whole number per other member, named by its letter: an object of scalar fields, the
    shape every backend's structured output (and the dummy model) answers."""
    return _schema({label: {"type": "integer", "minimum": 0, "maximum": max_points} for label in LABELS[:others]},
                   cot)
