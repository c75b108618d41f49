"""The vote's parameters: the scenario's `ballot:` and `prompt:` sections.

Options are compared by `option_key` (Unicode-normalised, surrounding and repeated whitespace
dropped, case folded): two options with the same key are one option written twice, so the
scenario is refused, and an answer is matched to an option by the same key (see parsing.py).
"""

from __future__ import annotations

import unicodedata
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from populace.sdk import Params

MAX_OPTIONS = 26  # more than a ballot paper: a question with that many answers is free text
MAX_OPTION_CHARS = 200
MAX_QUESTION_CHARS = 4000
# Chain of thought needs room to think: the answer budget when `model.max_tokens` is not set.
COT_MAX_TOKENS = 256
# The platform's default answer budget (`model.max_tokens`); a direct answer with a long option
# needs more, or the JSON is cut off and the answer lost.
DEFAULT_MAX_TOKENS = 48


def option_key(text: str) -> str:
    """How two spellings of one option compare: NFKC (an "é" typed as e + accent is "é"),
    whitespace collapsed, case folded."""
    return " ".join(unicodedata.normalize("NFKC", text).split()).casefold()


def _text(value: object) -> str:
    """A YAML scalar that must be text, trimmed. YAML 1.1 reads unquoted yes/no/on/off as
    booleans and 1 as a number: say so instead of recording `True` as an option."""
    if isinstance(value, bool):
        raise ValueError('must be text; YAML reads unquoted yes/no/on/off/true/false as booleans, '
                         'so quote it ("yes")')
    if not isinstance(value, str):
        raise ValueError(f"must be text, not {type(value).__name__} (quote it in YAML)")
    text = value.strip()
    if not text:
        raise ValueError("must not be empty")
    return text


def _option(value: object) -> str:
    text = _text(value)
    if any(ch in text for ch in "\r\n\t"):
        raise ValueError("must be on one line (the options are listed in the prompt)")
    if len(text) > MAX_OPTION_CHARS:
        raise ValueError(f"must be at most {MAX_OPTION_CHARS} characters, not {len(text)}")
    return text


def _question(value: object) -> str:
    text = _text(value)
    if len(text) > MAX_QUESTION_CHARS:
        raise ValueError(f"must be at most {MAX_QUESTION_CHARS} characters, not {len(text)}")
    return text


Option = Annotated[str, BeforeValidator(_option)]
Question = Annotated[str, BeforeValidator(_question)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BallotConfig(_Section):
    """The question every agent answers and the options it chooses from (in the order shown)."""

    question: Question = "Should private cars be banned from your city's centre?"
    options: tuple[Option, ...] = ("yes", "no")
    # From round 2 on, every agent hears the shares of last round's valid answers.
    show_distribution: bool = False
    # Turnout (activation): each round a seeded share of the voters votes — drawn again every
    # round, the same on every placement; the others do not play and are not recorded.
    turnout: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)

    @field_validator("options", mode="before")
    @classmethod
    def _a_list(cls, value: object) -> object:
        if not isinstance(value, (list, tuple)):
            raise ValueError('must be a list of options, e.g. ["yes", "no"]')
        return value

    @field_validator("options")
    @classmethod
    def _distinct(cls, options: tuple[str, ...]) -> tuple[str, ...]:
        # counted here, after each option is checked, so one bad option is one error, not two
        if not 2 <= len(options) <= MAX_OPTIONS:
            raise ValueError(f"needs 2 to {MAX_OPTIONS} options, not {len(options)}")
        seen: dict[str, int] = {}
        for i, option in enumerate(options):
            first = seen.setdefault(option_key(option), i)
            if first != i:
                raise ValueError(f"option {i} ({option!r}) repeats option {first} ({options[first]!r}); "
                                 "options are compared ignoring case and spacing")
        return options


class PromptConfig(_Section):
    """Which prompt variant the agents get. The system prompt (shared by every agent, so
    replicas cache it) is the poll, the question and its options, an optional note on the
    population's make-up and the answer instruction; the user prompt carries the agent's
    persona, last round's distribution (when shown), its own earlier answers and the request."""

    # direct: choose at once; cot: think step by step first (chain of thought), still one
    # structured call: {"reasoning": ..., "choice": ...}.
    answer: Literal["direct", "cot"] = "direct"
    persona: bool = True  # put the agent's persona in its prompt (when the run has a population)
    population_note: bool = False  # tell every agent the population's make-up (needs a population)


class VoteParams(Params):
    ballot: BallotConfig = BallotConfig()
    prompt: PromptConfig = PromptConfig()


def extra_answer_tokens(options: tuple[str, ...]) -> int:
    """Tokens beyond the platform's default budget that `{"choice": "<longest option>"}` may
    need: the JSON around it (16) plus one token per UTF-8 byte of the option (a byte-level
    tokenizer never needs more), so no answer is cut off. 0 for short options."""
    needed = 16 + max(len(o.encode()) for o in options)
    return max(0, needed - DEFAULT_MAX_TOKENS)
