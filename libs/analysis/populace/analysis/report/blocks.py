"""What a report page is made of: sections of blocks (a figure, a table, a note …) that the
Jinja2 templates render, one macro per kind. Plain data; cells are plain text (escaped by the
templates)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import plotly.graph_objects as go

from populace.analysis.report.answer_rows import PAGE_SIZE, AnswerRows


@dataclass
class Plot:
    figure: go.Figure
    label: str  # what the figure shows, for a screen reader (aria-label)
    kind: str = "plot"
    dom_id: str = ""  # set when the page is assembled: figure-1, figure-2 …
    spec: str = ""  # the figure as Plotly JSON, set with dom_id


@dataclass
class Table:
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    left: Sequence[int] = (0,)  # columns aligned left (text); the others are numbers
    kind: str = "table"


@dataclass
class KeyValues:
    rows: Sequence[tuple[str, str]]
    kind: str = "keyvalues"


@dataclass
class Note:
    text: str
    tone: str = "note"  # note (grey), warn (amber) or text (plain paragraph)
    kind: str = "note"


@dataclass
class Heading:
    text: str
    kind: str = "heading"


@dataclass
class Details:
    summary: str
    text: str  # preformatted
    kind: str = "details"


@dataclass
class InvalidAnswers:
    """Every invalid answer (up to the cap) with its raw text, paged in the browser."""

    answers: AnswerRows
    page_size: int = PAGE_SIZE
    kind: str = "invalid"


@dataclass
class Reasoning:
    """Each agent's valid answers with the reasoning (or raw text) before them, paged and
    searchable by agent id or text in the browser."""

    answers: AnswerRows
    with_reasoning: bool  # the answers carry a chain of thought (else the raw texts are shown)
    page_size: int = PAGE_SIZE
    kind: str = "reasoning"


@dataclass
class Section:
    title: str
    blocks: list = field(default_factory=list)
    anchor: str | None = None  # id of the section (the table of contents links to it)
