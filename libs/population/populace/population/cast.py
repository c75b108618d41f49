"""A run's cast: who each agent is, built once per process from the personas file (pure).

Every agent holds a reference to one `Persona` (identical personas are one shared object),
never a copy: a million agents of a `--unique 1000` population share a thousand personas.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from populace.population.jsonl import iter_personas

# Profile keys the persona sentence already states.
_STATED = {"name", "age", "gender", "sex"}
# A categorical attribute with more values than this is not summarised in a population note.
NOTE_MAX_CATEGORIES = 12


@dataclass(frozen=True, slots=True)
class Persona:
    """One agent's background: `text` speaks it in the second person ("You are Ana, 34 years
    old, female. Education: Ph.D. …"); `profile` holds the sampled attributes."""

    index: int  # the persona's line in the personas file
    text: str
    profile: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Cast:
    personas: list[Persona]  # persona of agent i

    def __len__(self) -> int:
        return len(self.personas)

    @property
    def profiles(self) -> list[Mapping[str, Any]]:
        return [p.profile for p in self.personas]

    def note(self, noun: str | None = None) -> str:
        """The population's make-up in one paragraph (see `population_note`)."""
        return population_note(self.profiles, noun)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _label(key: str) -> str:
    return key.replace("_", " ").strip().capitalize()


def persona_text(record: Mapping) -> str:
    """One agent's background, from a personas JSONL record ({profile, persona, …}).
    The persona's own fields come first, then every profile attribute it does not state."""
    persona = record.get("persona") or {}
    profile = record.get("profile") or {}
    name = persona.get("name") or profile.get("name")
    age = persona.get("age", profile.get("age"))
    gender = persona.get("gender", profile.get("gender"))
    who = [f"You are {name}" if name else "You are a player"]
    if age is not None:
        who.append(f"{_num(age) if isinstance(age, (int, float)) else age} years old")
    if gender:
        who.append(str(gender))
    parts = [", ".join(who) + "."]
    for key, value in profile.items():
        if key.lower() not in _STATED and value is not None:
            parts.append(f"{_label(key)}: {_num(value) if isinstance(value, (int, float)) else value}.")
    description = (persona.get("description") or "").strip()
    if description:
        parts.append(description if description.endswith(".") else description + ".")
    return " ".join(parts)


def population_note(profiles: Iterable[Mapping], noun: str | None = None) -> str:
    """The population's make-up in one paragraph: each categorical attribute's shares and each
    numeric attribute's range, e.g. "The players are 50 people. Education: 20% Ph.D., …"
    (`noun`: what the simulation calls its agents; default "The population is 50 people.")."""
    profiles = list(profiles)
    if not profiles:
        return ""
    keys: list[str] = []
    for p in profiles:
        keys.extend(k for k in p if k not in keys)
    parts = [f"The {noun} are {len(profiles)} people." if noun else f"The population is {len(profiles)} people."]
    for key in keys:
        values = [p[key] for p in profiles if p.get(key) is not None]
        if not values:
            continue
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            lo, hi = min(values), max(values)
            parts.append(f"{_label(key)}: from {_num(lo)} to {_num(hi)}.")
            continue
        counts = Counter(str(v) for v in values)
        if len(counts) > NOTE_MAX_CATEGORIES:
            continue
        shares = ", ".join(f"{round(100 * c / len(profiles))}% {v}" for v, c in counts.most_common())
        parts.append(f"{_label(key)}: {shares}.")
    return " ".join(parts)


def cast_from_records(records: Iterable[dict]) -> Cast:
    """One Persona per record; identical (text, profile) pairs become one shared object, and
    identical profiles one shared (read-only) mapping: a million personas of a few attribute
    combinations hold a few profile dicts, not a million (~230 bytes each)."""
    shared: dict[tuple[str, str], Persona] = {}
    profiles: dict[str, Mapping[str, Any]] = {}
    personas = []
    for i, record in enumerate(records):
        profile = record.get("profile") or {}
        text = persona_text(record)
        profile_key = json.dumps(profile, sort_keys=True, default=str)
        profile = profiles.setdefault(profile_key, profile)
        key = (text, profile_key)
        persona = shared.get(key)
        if persona is None:
            persona = shared[key] = Persona(i, text, profile)
        personas.append(persona)
    return Cast(personas)


def cast_from_jsonl(data: bytes, source: str = "personas") -> Cast:
    return cast_from_records(iter_personas(data, source))
