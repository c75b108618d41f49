"""Turning an LLM's text into a choice. Never invents an answer: anything that is not one of
the options is None (invalid), and the caller keeps the raw text.

An answer names an option when it equals the option's text up to case and spacing
(`option_key`): the options are distinct under that comparison (params.py), so the match is
never ambiguous, and "Yes" from a model that ignored the schema's casing is still "yes".
Nothing looser: "yes." or "I vote yes" is invalid.
"""

from __future__ import annotations

from collections.abc import Mapping

from populace.sdk.answers import answer_field
from populace_vote.params import option_key

Lookup = Mapping[str, str]  # option_key(text) -> the option as the scenario wrote it


def lookup_of(options: tuple[str, ...]) -> Lookup:
    """Built once per run on each process; parse_choice is one dict lookup per agent."""
    return {option_key(o): o for o in options}


def parse_choice(text: str, lookup: Lookup) -> str | None:
    """Accepts the structured answer `{"choice": "yes"}` (with or without `reasoning`) or the
    bare option ("yes", " Yes "). Returns the option as the scenario wrote it, or None."""
    choice = answer_field(text, "choice")
    # a bare answer, or text that only looks like JSON (an option may itself start with "{"),
    # comes back as text and is looked up as it is
    return lookup.get(option_key(choice)) if isinstance(choice, str) else None
