"""Template personas (no LLM) and the persona JSONL record format.

The ``template`` persona mode turns a sampled profile into a persona with fixed rules and
small built-in name lists, fast enough for millions of agents. The output format is shared
with the LLM modes: one JSON object per line::

    {"profile":    {"education": "master's", "age": 34, "gender": "female", ...},
     "persona":    {"name": "Maria Lopez", "gender": "female", "age": 34,
                    "description": "A 34-year-old economist with a master's degree who ..."},
     "provenance": {"mode": "template", "prompt_version": "template-v1", "model": null,
                    "seed": 0, "config_hash": "<sha256 of the canonical config JSON>",
                    "population": "education-study", "index": 0}}

Consistency with the profile: ``gender`` and ``age`` are copied from the profile when it
has them (keys ``gender``/``sex`` and ``age``, any case); otherwise they are drawn
deterministically from ``(seed, index)`` (gender female/male, age 18-80). The first name
follows the gender (a neutral list for other genders). The description names the age, the
occupation and education when present, two personality traits, and every other attribute.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

from populace.population.config import PopulationConfig, config_hash
from populace.population.jsonl import read_jsonl, write_jsonl
from populace.population.names import (
    FEMALE_FIRST,
    LAST,
    MALE_FIRST,
    NEUTRAL_FIRST,
    TRAITS,
)
from populace.population.sampling import sample_profiles

__all__ = [
    "TEMPLATE_PROMPT_VERSION",
    "persona_record",
    "read_jsonl",
    "template_persona",
    "template_provenance",
    "template_records",
    "write_jsonl",
]

TEMPLATE_PROMPT_VERSION = "template-v1"
"""Bumped whenever the template rules change the personas they produce."""

GENDER_KEYS = ("gender", "sex")
AGE_KEYS = ("age",)
_OCCUPATION_KEYS = ("occupation", "profession", "job")
_EDUCATION_KEYS = ("education", "education_level", "education level")

_FEMALE = {"female", "f", "woman", "women", "girl", "lady"}
_MALE = {"male", "m", "man", "men", "boy", "gentleman"}


def find_attribute(profile: dict, keys: tuple[str, ...]) -> tuple[str | None, Any]:
    """(key, value) of the first profile attribute named one of `keys`, in any case."""
    for k, v in profile.items():
        if isinstance(k, str) and k.lower() in keys:
            return k, v
    return None, None


def gender_class(value: Any) -> str:
    """'female', 'male', or the value itself (lower-cased) for any other gender."""
    s = str(value).strip().lower()
    return "female" if s in _FEMALE else "male" if s in _MALE else s


def _article(word: str) -> str:
    w = word.lstrip().lower()
    if not w:
        return "a"
    if w[0].isdigit():  # an 8-year-old, an 18-year-old, an 80-year-old, an 11-year-old
        digits = w.split("-")[0]
        return "an" if digits.startswith("8") or digits in ("11", "18") else "a"
    if w.startswith(("uni", "use", "usu", "eu", "one")):
        return "a"
    if w.startswith(("hour", "honest", "heir")):
        return "an"
    return "an" if w[0] in "aeiou" else "a"


def _education_phrase(value: Any) -> str:
    text = str(value).strip()
    v = text.lower()
    if "elementary" in v or "primary" in v:
        return "with an elementary school education"
    if "high school" in v or "secondary" in v:
        return "with a high school diploma"
    if "bachelor" in v:
        return "with a bachelor's degree"
    if "master" in v:
        return "with a master's degree"
    if "ph.d" in v or "phd" in v:
        return "with a Ph.D."
    if "doctor" in v:
        return "with a doctorate"
    return f"with {_article(text)} {text} education"


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def _pronouns(gender: str) -> tuple[str, str]:
    g = gender_class(gender)
    if g == "female":
        return "She", "Her"
    if g == "male":
        return "He", "His"
    return "They", "Their"


def template_persona(profile: dict, index: int, seed: int) -> dict:
    """A persona built from ``profile`` without an LLM; the same inputs give the same persona.

    Returns ``{"name", "gender", "age", "description"}``.
    """
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=16).digest()
    h = int.from_bytes(digest, "little")

    gender_key, gender_val = find_attribute(profile, GENDER_KEYS)
    h, g_pick = divmod(h, 2)
    gender = str(gender_val) if gender_key is not None else ("female", "male")[g_pick]

    age_key, age_val = find_attribute(profile, AGE_KEYS)
    h, a_pick = divmod(h, 63)
    if age_key is not None and isinstance(age_val, (int, float)) and not isinstance(age_val, bool):
        age = round(age_val)
    else:
        age = 18 + a_pick

    g = gender_class(gender)
    firsts = FEMALE_FIRST if g == "female" else MALE_FIRST if g == "male" else NEUTRAL_FIRST
    h, f_pick = divmod(h, len(firsts))
    h, l_pick = divmod(h, len(LAST))
    name = f"{firsts[f_pick]} {LAST[l_pick]}"

    h, t1 = divmod(h, len(TRAITS))
    h, step = divmod(h, len(TRAITS) - 1)
    t2 = (t1 + 1 + step) % len(TRAITS)

    occ_key, occ_val = find_attribute(profile, _OCCUPATION_KEYS)
    edu_key, edu_val = find_attribute(profile, _EDUCATION_KEYS)
    if occ_key is not None:
        noun = str(occ_val)
    else:
        noun = "woman" if g == "female" else "man" if g == "male" else "person"
    age_phrase = f"{age}-year-old"
    parts = [f"{_article(age_phrase).capitalize()} {age_phrase} {noun}"]
    if edu_key is not None:
        parts.append(_education_phrase(edu_val))
    parts.append(f"who is {TRAITS[t1]} and {TRAITS[t2]}.")
    description = " ".join(parts)

    used = {gender_key, age_key, occ_key, edu_key}
    extras = [(k, v) for k, v in profile.items() if k not in used]
    if extras:
        _, possessive = _pronouns(gender)
        clauses = [f"{str(k).replace('_', ' ')} is {_fmt(v)}" for k, v in extras]
        first = f"{possessive} {clauses[0]}"
        rest = [f"{possessive.lower()} {c}" for c in clauses[1:]]
        if rest:
            sentence = ", ".join([first] + rest[:-1]) + f" and {rest[-1]}."
        else:
            sentence = first + "."
        description = f"{description} {sentence}"

    return {"name": name, "gender": gender, "age": age, "description": description}


def persona_record(profile: dict, persona: dict, provenance: dict) -> dict:
    """One line of a personas JSONL file: ``{"profile", "persona", "provenance"}``."""
    return {"profile": profile, "persona": persona, "provenance": provenance}


def template_provenance(cfg: PopulationConfig, seed: int | None = None) -> dict:
    """The provenance shared by every template persona of ``cfg`` (add ``index`` per record)."""
    return {
        "mode": "template",
        "prompt_version": TEMPLATE_PROMPT_VERSION,
        "model": None,
        "seed": cfg.seed if seed is None else seed,
        "config_hash": config_hash(cfg),
        "population": cfg.name,
    }


def template_records(cfg: PopulationConfig, count: int | None = None,
                     seed: int | None = None,
                     profiles: Iterable[dict] | None = None) -> Iterator[dict]:
    """Sample profiles (or use ``profiles``) and yield one template persona record each."""
    s = cfg.seed if seed is None else seed
    if profiles is None:
        profiles = sample_profiles(cfg, count, seed=s)
    base = template_provenance(cfg, s)
    for i, profile in enumerate(profiles):
        persona = template_persona(profile, i, s)
        yield persona_record(profile, persona, {**base, "index": i})
