"""Interviews' questions: what agents answer from a copy of their state (populace.sdk.interview):
one `Question`, a `Survey` of them, and a survey the scenario plans after rounds (`PlannedInterview`)."""

from __future__ import annotations

import math
import unicodedata
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from populace.core.contracts.wire_base import FiniteFloat, Strict, _not_bool

# A survey's or a question's id: a column value and a part of message ids (no dots or spaces).
InterviewId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
MAX_QUESTION_CHARS = 4000
MAX_CHOICES = 26  # more than a ballot paper: a question with that many answers is free text
MAX_LIKERT_POINTS = 11
MAX_ANSWER_CHARS = 10_000


def choice_key(text: str) -> str:
    """How two spellings of one option compare (and an answer is matched to an option): NFKC,
    whitespace collapsed, case folded."""
    return " ".join(unicodedata.normalize("NFKC", text).split()).casefold()


def _one_line(value: str, what: str) -> str:
    text = value.strip()
    if not text:
        raise ValueError(f"{what} must not be empty")
    if any(ch in text for ch in "\r\n\t"):
        raise ValueError(f"{what} {text!r} must be on one line (they are listed in the prompt)")
    if len(text) > 200:
        raise ValueError(f"{what} must be at most 200 characters, not {len(text)}")
    return text


class Question(Strict):
    """One question an agent answers, in one structured call (`populace.sdk.interview`). Its
    kind says what a valid answer is: one of `options`; a point 1..`points` of a Likert scale
    (`labels`: one per point, or none); a `number` in [min, max] (whole with `integer`); free
    `text` of at most `max_chars`. `kind` may be left out when the other keys say it."""

    id: InterviewId
    text: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    kind: Literal["options", "likert", "number", "text"]
    options: list[str] | None = None
    points: Annotated[int, BeforeValidator(_not_bool)] | None = None
    labels: list[str] | None = None
    min: FiniteFloat | None = None
    max: FiniteFloat | None = None
    integer: bool = False
    max_chars: Annotated[int, BeforeValidator(_not_bool)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _kind_from_keys(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("kind") is None:
            keys = {k for k, v in data.items() if v is not None}
            kind = ("options" if "options" in keys else "likert" if keys & {"points", "labels"}
                    else "number" if keys & {"min", "max", "integer"} else "text")
            data = {**data, "kind": kind}
        return data

    @field_validator("text")
    @classmethod
    def _has_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a question needs its text")
        return value.strip()

    @model_validator(mode="after")
    def _fits_kind(self) -> Question:
        kind = self.kind
        own = {"options": ("options",), "likert": ("points", "labels"), "number": ("min", "max"),
               "text": ("max_chars",)}
        for field, value in (("options", self.options), ("points", self.points), ("labels", self.labels),
                             ("min", self.min), ("max", self.max), ("max_chars", self.max_chars)):
            if value is not None and field not in own[kind]:
                raise ValueError(f"{field}: not a key of a {kind} question")
        if self.integer and kind != "number":
            raise ValueError(f"integer: not a key of a {kind} question")
        if kind == "options":
            options = [_one_line(o, "an option") for o in self.options or ()]
            if not 2 <= len(options) <= MAX_CHOICES:
                raise ValueError(f"options: a question with options needs 2 to {MAX_CHOICES}, not {len(options)}")
            seen: dict[str, int] = {}
            for i, option in enumerate(options):
                first = seen.setdefault(choice_key(option), i)
                if first != i:
                    raise ValueError(f"options: option {i} ({option!r}) repeats option {first} "
                                     f"({options[first]!r}); options are compared ignoring case and spacing")
            object.__setattr__(self, "options", options)
        elif kind == "likert":
            labels = [_one_line(label, "a label") for label in self.labels] if self.labels is not None else None
            points = self.points if self.points is not None else (len(labels) if labels else 5)
            if not 2 <= points <= MAX_LIKERT_POINTS:
                raise ValueError(f"points: a Likert scale needs 2 to {MAX_LIKERT_POINTS} points, not {points}")
            if labels is not None and len(labels) != points:
                raise ValueError(f"labels: {len(labels)} labels for {points} points (one label per point)")
            if labels is not None and len({choice_key(label) for label in labels}) < len(labels):
                raise ValueError("labels: two labels are the same (compared ignoring case and spacing)")
            object.__setattr__(self, "points", points)
            object.__setattr__(self, "labels", labels)
        elif kind == "number":
            if self.min is None or self.max is None:
                raise ValueError("min, max: a number question needs its range (both min and max)")
            if self.min >= self.max:
                raise ValueError(f"min: {self.min:g} must be below max ({self.max:g})")
            if self.integer and math.floor(self.max) < math.ceil(self.min):
                raise ValueError(f"min, max: no whole number lies in [{self.min:g}, {self.max:g}]")
        else:
            chars = self.max_chars if self.max_chars is not None else 500
            if not 1 <= chars <= MAX_ANSWER_CHARS:
                raise ValueError(f"max_chars: 1 to {MAX_ANSWER_CHARS}, not {chars}")
            object.__setattr__(self, "max_chars", chars)
        return self


class Survey(Strict):
    """Questions asked together of the same agents. `mode`: `each` (the default) asks every
    question in a structured call of its own; `together` asks them all in one call."""

    id: InterviewId
    questions: list[Question] = Field(min_length=1, max_length=50)
    mode: Literal["each", "together"] = "each"

    @field_validator("questions")
    @classmethod
    def _distinct_ids(cls, questions: list[Question]) -> list[Question]:
        seen: set[str] = set()
        for i, q in enumerate(questions):
            if q.id in seen:
                raise ValueError(f"question {i}'s id {q.id!r} is used twice in the survey")
            seen.add(q.id)
        return questions

    def question(self, qid: str) -> Question:
        return next(q for q in self.questions if q.id == qid)


class PlannedInterview(Survey):
    """A survey the scenario asks after given rounds (`after: [2, 4]`), or after every round
    (`after: every`: a panel, the same agents each round), of every agent, a seeded `sample`
    share of them, or the listed `agents`."""

    after: list[Annotated[int, BeforeValidator(_not_bool), Field(ge=1, le=10_000)]] | Literal["every"]
    sample: FiniteFloat | None = Field(None, gt=0, le=1)
    agents: list[Annotated[int, BeforeValidator(_not_bool), Field(ge=0)]] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _who(self) -> PlannedInterview:
        if self.sample is not None and self.agents is not None:
            raise ValueError("sample, agents: give one of them (or neither: every agent)")
        if isinstance(self.after, list) and not self.after:
            raise ValueError("after: the rounds after which to ask (or `every`)")
        return self

    @property
    def survey(self) -> Survey:
        return Survey(id=self.id, questions=self.questions, mode=self.mode)

    def rounds(self, last: int) -> list[int]:
        """The rounds (up to `last`) after which it is asked."""
        return list(range(1, last + 1)) if self.after == "every" else sorted(r for r in set(self.after) if r <= last)
