"""A run's cast: the persona background each agent speaks from and the note on the
population's make-up, built once per host from the personas file (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from populace.games.prompts import persona_text, population_note
from populace.population.jsonl import parse_personas


@dataclass(frozen=True, slots=True)
class Cast:
    texts: list[str]  # persona background of agent i (identical texts are one shared string)
    note: str  # the population's make-up, for the shared system prompt

    def __len__(self) -> int:
        return len(self.texts)


def cast_from_records(records: list[dict]) -> Cast:
    shared: dict[str, str] = {}
    texts = [shared.setdefault(t, t) for t in map(persona_text, records)]
    return Cast(texts, population_note(r["profile"] for r in records))


def cast_from_jsonl(data: bytes, source: str = "personas") -> Cast:
    return cast_from_records(parse_personas(data, source))
