"""Persona generation's pure logic: the LLM meta-prompt, the answer schema, the checks, and
the ``--unique K`` assignment. No I/O here: ``populace personas generate`` (the CLI) sends
the prompts through the inference gateway and calls these functions to decide what to ask
and what to keep.

Per persona:

1. **Prompt** — :data:`SYSTEM_PROMPT` (the same for every request, so replicas reuse its KV
   cache) and :func:`user_prompt` (the profile's attributes, one per line, then "Write the
   persona of this 40-year-old man as JSON."). The answer schema (:func:`persona_schema`) is
   ``{gender, age, name, description}``, all required; ``age`` is an integer between the
   profile's :func:`age_bounds` (the value itself for a numeric age, a range like ``"25-34"``
   for a categorical one, else :data:`DEFAULT_AGE_BOUNDS`, 18-90) and ``gender``, when the
   profile has one, is that value. Prompts sharing a schema can be sent to the model
   together.
2. **Grammar** — bounds and fixed values are also given as ``enum``, the name and the
   description as ``pattern`` (:data:`NAME_PATTERN`, :data:`DESCRIPTION_PATTERN`). llama.cpp
   turns the schema into a grammar that (unlike the gateway's own check) understands these,
   so even SmolLM2-135M writes the right age and gender, a "First Last" name and a 40-200
   character description without braces or placeholders, and its answer always ends
   (inside :data:`MAX_TOKENS`).
3. **Validity** — the gateway checks each answer against the schema (re-asking once) and
   says whether it satisfied it; :func:`parse_persona` reads an answer that did.
4. **Consistency** (:func:`consistency_problem`) — age inside the bounds, gender equal to the
   profile's (synonyms such as woman/female accepted), a plausible name, a description of
   at least five words that states no other age ("a 16-year-old", "in his fifties"), whose
   pronouns do not contradict the profile's gender, that reads as prose and that does not
   repeat the instructions.
5. **De-duplication** — by :func:`dedupe_key`, the normalised ``(name, description)``
   (case, accents, punctuation and spacing ignored). The first persona with a key keeps it.
6. **Retries regenerate** — an invalid, inconsistent or duplicate answer is *not* re-parsed:
   a new request is sent with another sampling seed (:func:`model_seed`) and a higher
   temperature (:data:`TEMPERATURES`), up to :data:`MAX_TRIES` tries in all. After the last
   failed try the persona is built by the template rules (:func:`fallback_persona`), and
   :func:`reason_kind` sorts the last failure's reason for the summary.

``--unique K`` (:func:`assign_unique`) generates K personas for K representative profiles and
gives each of the N agents the persona of a representative with the same categorical
attributes whenever K is at least the number of categorical combinations, and otherwise
matches attributes in declaration order (the first one, e.g. education, as long as K is at
least its number of values). Each agent keeps its own sampled profile, so the quotas stay
exact; the persona's own fields (its age, say) are its representative's.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from populace.population.allocation import largest_remainder
from populace.population.config import (
    CategoricalAttribute,
    ConditionalAttribute,
    NumericAttribute,
    PopulationConfig,
)
from populace.population.personas import AGE_KEYS, GENDER_KEYS, find_attribute, gender_class, template_persona

__all__ = [
    "DEFAULT_AGE_BOUNDS",
    "DESCRIPTION_PATTERN",
    "MAX_TOKENS",
    "MAX_TRIES",
    "NAME_PATTERN",
    "PROMPT_VERSION",
    "SYSTEM_PROMPT",
    "TEMPERATURES",
    "Assignment",
    "age_bounds",
    "assign_unique",
    "attribute_kinds",
    "category_counts",
    "consistency_problem",
    "dedupe_key",
    "fallback_persona",
    "model_seed",
    "parse_persona",
    "persona_schema",
    "profile_gender",
    "reason_kind",
    "user_prompt",
]

PROMPT_VERSION = "persona-v1"
"""Bumped whenever the meta-prompt, the schema or the checks change."""

DEFAULT_AGE_BOUNDS = (18, 90)
MAX_TRIES = 3
TEMPERATURES = (0.7, 0.9, 1.0)  # per try: a regeneration samples more freely
MAX_TOKENS = 160
DESCRIPTION_PATTERN = r'^[A-Z][^{}\[\]<>|#*_\\@~^="\n\r\t]{39,199}$'
"""The grammar's shape for a description: 40-200 characters (so an answer always ends well
inside MAX_TOKENS and never after three words), starting with a capital letter, without
braces, brackets, markup or placeholders."""
NAME_PATTERN = r"^[A-Z][a-z]{1,15} [A-Z][a-z]{1,15}$"
"""The grammar's shape for a name (first and last name). The check after the answer is looser."""

SYSTEM_PROMPT = (
    "You write personas for a social-science study. Given one person's profile, invent that "
    "person: a first and last name that fits their gender, and a description in two short "
    "sentences, in the third person, of their job, background and personality. Everything "
    "must agree with the profile. Answer with JSON only."
)

_FEMALE_WORDS = {"she", "her", "hers", "herself", "woman", "girl", "lady", "mother", "wife"}
_MALE_WORDS = {"he", "him", "his", "himself", "man", "boy", "gentleman", "father", "husband"}
_STATED_AGE = re.compile(r"\b(\d{1,3})[- ]?(?:years?|yrs?)[- ]old\b", re.IGNORECASE)
_DECADES = {"twenties": 20, "thirties": 30, "forties": 40, "fifties": 50, "sixties": 60,
            "seventies": 70, "eighties": 80, "nineties": 90}
_DECADE = re.compile(r"\b(in (?:his|her|their) (?:(?:early|mid|late)[- ]?)?)"
                     r"(20s|30s|40s|50s|60s|70s|80s|90s|" + "|".join(_DECADES) + r")\b", re.IGNORECASE)
_AGE_RANGE = re.compile(r"^\s*(\d{1,3})\s*(?:-|–|—|to)\s*(\d{1,3})\s*$")
_AGE_PLUS = re.compile(r"^\s*(\d{1,3})\s*\+\s*$")
_JUNK = re.compile(r"[{}\[\]<>|#*_\\@~^=]|https?:")
_ECHO = re.compile(r"\b(first and last name|third person|two (short )?sentences|the profile|json)\b", re.IGNORECASE)
_NAME_OK = re.compile(r"^[^\W\d_]+(?:[ '.-]+[^\W\d_]+)*\.?$")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def age_bounds(profile: dict) -> tuple[int, int]:
    """The persona ages allowed by a profile, inclusive.

    A numeric ``age`` gives ``(floor(age), ceil(age))`` — the age itself for whole numbers;
    a categorical one like ``"25-34"``, ``"25 to 34"`` or ``"65+"`` gives its range (``65+``:
    65 to max(65, 90)); no age (or one we cannot read) gives :data:`DEFAULT_AGE_BOUNDS`.
    """
    _, v = find_attribute(profile, AGE_KEYS)
    if _is_number(v):
        return math.floor(v), math.ceil(v)
    if isinstance(v, str):
        if m := _AGE_RANGE.match(v):
            a, b = int(m.group(1)), int(m.group(2))
            return (a, b) if a <= b else (b, a)
        if m := _AGE_PLUS.match(v):
            a = int(m.group(1))
            return a, max(a, DEFAULT_AGE_BOUNDS[1])
    return DEFAULT_AGE_BOUNDS


def profile_gender(profile: dict) -> str | None:
    """The profile's gender (key ``gender`` or ``sex``, any case) as text, or None."""
    _, v = find_attribute(profile, GENDER_KEYS)
    return None if v is None else str(v)


def persona_schema(profile: dict) -> dict:
    """The JSON schema an answer for ``profile`` must satisfy.

    ``gender``/``age``/``name``/``description`` are required; ``age`` has the profile's
    :func:`age_bounds` as minimum/maximum (and as an ``enum`` when the range is small, for
    grammar-constrained replicas), ``gender`` is an ``enum`` of the profile's gender when it
    has one, ``name`` has :data:`NAME_PATTERN` and ``description``
    :data:`DESCRIPTION_PATTERN`. The gateway's check uses type, required and
    minimum/maximum; llama.cpp's grammar uses enum and pattern as well.
    """
    lo, hi = age_bounds(profile)
    age: dict = {"type": "integer", "minimum": lo, "maximum": hi}
    if hi - lo <= 100:
        age["enum"] = list(range(lo, hi + 1))
    gender: dict = {"type": "string"}
    if (g := profile_gender(profile)) is not None:
        gender["enum"] = [g]
    return {
        "type": "object",
        "properties": {
            "gender": gender,
            "age": age,
            "name": {"type": "string", "pattern": NAME_PATTERN},
            "description": {"type": "string", "pattern": DESCRIPTION_PATTERN},
        },
        "required": ["gender", "age", "name", "description"],
    }


def _fmt_value(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, float):
        return f"{v:.2f}".rstrip("0").rstrip(".")
    return str(v)


def _who(profile: dict) -> str:
    """"40-year-old man", "woman", "person" … — repeats age and gender in plain words, which a
    small model follows far more reliably than the attribute list alone."""
    lo, hi = age_bounds(profile)
    _, v = find_attribute(profile, AGE_KEYS)
    age = f"{lo}-year-old " if lo == hi and v is not None else ""
    g = profile_gender(profile)
    noun = {"female": "woman", "male": "man"}.get(gender_class(g) if g is not None else "", "person")
    return age + noun


def user_prompt(profile: dict) -> str:
    """The per-persona prompt: every profile attribute, one per line, in profile order, then
    the request naming age and gender again ("… of this 40-year-old man as JSON")."""
    lines = [f"- {str(k).replace('_', ' ')}: {_fmt_value(v)}" for k, v in profile.items()]
    return "Profile:\n" + "\n".join(lines) + f"\nWrite the persona of this {_who(profile)} as JSON."


def parse_persona(text: str) -> dict | None:
    """``{name, gender, age, description}`` from an answer, or None when it is not such JSON."""
    try:
        value = json.loads(text)
    except (ValueError, TypeError):
        return None
    if not isinstance(value, dict):
        return None
    name, gender, age, desc = (value.get(k) for k in ("name", "gender", "age", "description"))
    if not (isinstance(name, str) and isinstance(gender, str) and isinstance(desc, str)):
        return None
    if not _is_number(age) or age != int(age):
        return None
    return {"name": " ".join(name.split()), "gender": gender.strip(), "age": int(age),
            "description": " ".join(desc.split())}


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def consistency_problem(persona: dict, profile: dict) -> str | None:
    """Why ``persona`` contradicts ``profile`` (a short reason), or None when it is consistent.

    Checks: age inside :func:`age_bounds`; gender equal to the profile's (case-insensitive;
    female/woman/f… and male/man/m… are synonyms); a name of letters (2-4 words, no digits or
    underscores, at most 60 characters); a description of at least 5 words that states no
    age outside the bounds ("a 16-year-old", "in his late fifties"), that, when the profile
    has a gender, does not use only the other gender's pronouns or nouns (she/her/woman… vs
    he/his/man…), that reads as prose (no markup, brackets, placeholders, links or run-on
    "words" over 20 letters) and that does not repeat the instructions ("first and last
    name", "the profile", …).
    """
    lo, hi = age_bounds(profile)
    age = persona.get("age")
    if not _is_number(age) or not lo <= age <= hi:
        want = str(lo) if lo == hi else f"{lo}-{hi}"
        return f"age {age!r} is not the profile's age ({want})"
    g = profile_gender(profile)
    got = str(persona.get("gender", ""))
    if g is not None and gender_class(got) != gender_class(g):
        return f"gender {got!r} is not the profile's ({g!r})"
    name = str(persona.get("name", "")).strip()
    if not (3 <= len(name) <= 60 and _NAME_OK.match(name) and 2 <= len(name.split()) <= 4):
        return f"name {name!r} is not a first and last name"
    desc = str(persona.get("description", ""))
    words = _words(desc)
    if len(words) < 5:
        return "description is too short"
    if _JUNK.search(desc) or any(len(w) > 20 for w in re.findall(r"[^\W\d_]+", desc)):
        return "description is not prose (markup, placeholders or run-on words)"
    if _ECHO.search(desc):
        return "description repeats the instructions"
    for m in _STATED_AGE.finditer(desc):
        stated = int(m.group(1))
        if not lo <= stated <= hi:
            return f"description states age {stated}"
    for m in _DECADE.finditer(desc):
        word = m.group(2).lower()
        decade = int(word[:-1]) if word[0].isdigit() else _DECADES[word]
        if hi < decade or lo > decade + 9:
            return f"description states age {m.group(0).strip()!r}"
    if g is not None and gender_class(g) in ("female", "male"):
        own, other = ((_FEMALE_WORDS, _MALE_WORDS) if gender_class(g) == "female"
                      else (_MALE_WORDS, _FEMALE_WORDS))
        ws = set(words)
        if ws & other and not ws & own:
            return f"description speaks of a {'man' if other is _MALE_WORDS else 'woman'}"
    return None


def _normalise(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text)
    stripped = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(re.findall(r"\w+", stripped.casefold()))


def dedupe_key(persona: dict) -> tuple[str, str]:
    """``(name, description)`` normalised: case, accents, punctuation and spacing ignored."""
    return _normalise(str(persona.get("name", ""))), _normalise(str(persona.get("description", "")))


def attribute_kinds(cfg: PopulationConfig) -> tuple[list[str], list[str]]:
    """(categorical attribute names, numeric attribute names), in declaration order."""
    cats = [n for n, a in cfg.attributes.items() if isinstance(a, (CategoricalAttribute, ConditionalAttribute))]
    nums = [n for n, a in cfg.attributes.items() if isinstance(a, NumericAttribute)]
    return cats, nums


@dataclass
class Assignment:
    """``reps[j]`` is the agent whose profile persona *j* is generated for; ``persona_of[i]``
    is the persona agent *i* gets; ``exact[i]`` says whether that persona's profile has the
    same categorical attributes as agent *i*'s."""

    reps: list[int]
    persona_of: list[int]
    exact: list[bool]


def assign_unique(profiles: Sequence[dict], k: int, categorical: Sequence[str],
                  numeric: Sequence[str] = ()) -> Assignment:
    """Choose ``k`` representative profiles and give each agent one of their personas.

    The rule — categorical attributes are matched in declaration order, an earlier one
    before all later ones:

    1. The ``k`` persona slots are split over the values of the first categorical attribute,
       then each value's slots over the values of the second, and so on. At each split a
       group with ``s`` slots and ``L`` distinct full categorical combinations ("leaves")
       gives its subgroups: when ``s >= L``, at least their own leaf count each, the rest in
       proportion to ``size - leaves``; when ``s`` is at least the number of subgroups but
       below ``L``, one each, the rest in proportion to ``size - 1``; otherwise one each to
       the ``s`` largest subgroups (ties: the one seen first). The proportional parts use
       largest remainder, so no group gets more slots than agents.
    2. Inside a leaf with ``s`` slots the agents are sorted by their numeric attributes
       (declaration order, then agent index) and cut into ``s`` contiguous chunks of
       near-equal size; each chunk's middle agent is the representative and the chunk's
       agents get its persona (so ages stay close to the persona's).
    3. An agent of a subgroup that got no slot gets the persona of the representative
       sharing the most categorical attributes, compared in declaration order (an earlier
       attribute outweighs all later ones), then the nearest in numeric attributes (sum of
       distances scaled by each attribute's range), then the lowest persona index.

    Consequences: exactly ``k`` personas, each used by at least one agent; with ``k`` at
    least the number of categorical combinations every agent's persona has all its
    categorical values (``exact``); with ``k`` at least the number of values of the first
    attribute, every agent's persona has at least its first value (its education level,
    say). Profiles are not changed, so the sampled quotas hold exactly.
    """
    n = len(profiles)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"--unique must be between 1 and the agent count {n} (got {k!r})")
    cat_key = [tuple(p.get(a) for a in categorical) for p in profiles]

    def num_key(i: int) -> tuple:
        return tuple(profiles[i].get(a) if _is_number(profiles[i].get(a)) else 0 for a in numeric)

    reps: list[int] = []
    persona_of = [-1] * n
    exact = [False] * n

    def split(members: list[int], depth: int, slots: int) -> None:
        if depth == len(categorical):
            ordered = sorted(members, key=lambda i: (num_key(i), i))
            pos = 0
            for size in largest_remainder([1] * slots, len(ordered)):
                chunk = ordered[pos:pos + size]
                pos += size
                j = len(reps)
                reps.append(chunk[(len(chunk) - 1) // 2])
                for i in chunk:
                    persona_of[i] = j
                    exact[i] = True
            return
        groups: dict[Any, list[int]] = {}
        for i in members:
            groups.setdefault(cat_key[i][depth], []).append(i)
        subs = list(groups.values())
        leaves = [len({cat_key[i] for i in g}) for g in subs]
        if slots >= sum(leaves):
            base, weights = leaves, [len(g) - lv for g, lv in zip(subs, leaves)]
        elif slots >= len(subs):
            base, weights = [1] * len(subs), [len(g) - 1 for g in subs]
        else:
            order = sorted(range(len(subs)), key=lambda g: (-len(subs[g]), g))
            base, weights = [0] * len(subs), [0] * len(subs)
            for g in order[:slots]:
                base[g] = 1
        rest = slots - sum(base)
        extra = largest_remainder(weights, rest) if rest else [0] * len(subs)
        for g, b, e in zip(subs, base, extra):
            if b + e:
                split(g, depth + 1, b + e)

    split(list(range(n)), 0, k)

    left = [i for i in range(n) if persona_of[i] < 0]
    if left:
        spans = []
        for a in numeric:
            vals = [p.get(a) for p in profiles if _is_number(p.get(a))]
            spans.append((max(vals) - min(vals)) or 1.0 if vals else 1.0)
        rep_keys = [cat_key[r] for r in reps]
        best_for: dict[tuple, list[int]] = {}
        for i in left:
            key = cat_key[i]
            if key not in best_for:
                scores = [tuple(x == y for x, y in zip(key, rk)) for rk in rep_keys]
                top = max(scores)
                best_for[key] = [j for j, sc in enumerate(scores) if sc == top]
            mine = num_key(i)

            def dist(j: int, mine=mine) -> float:
                return sum(abs(x - y) / w for x, y, w in zip(mine, num_key(reps[j]), spans))

            persona_of[i] = min(best_for[key], key=lambda j: (dist(j), j))
    return Assignment(reps, persona_of, exact)


def fallback_persona(profile: dict, index: int, seed: int) -> dict:
    """The template persona used when the LLM gave no acceptable answer. A categorical age
    ("25-34") is first replaced by a whole age inside its range (chosen from the seed and
    index), so the fallback is as consistent with the profile as an LLM persona must be."""
    key, v = find_attribute(profile, AGE_KEYS)
    if key is not None and not _is_number(v):
        lo, hi = age_bounds(profile)
        h = int.from_bytes(hashlib.blake2b(f"{seed}:{index}:age".encode(), digest_size=8).digest(), "little")
        profile = {**profile, key: lo + h % (hi - lo + 1)}
    return template_persona(profile, index, seed)


def category_counts(profiles: Sequence[dict], attribute: str | None) -> dict[str, int]:
    """How many profiles have each value of ``attribute`` (as text); ``{}`` for None."""
    if attribute is None:
        return {}
    return dict(Counter(str(p.get(attribute)) for p in profiles))


def reason_kind(reason: str) -> str:
    """The kind of a rejection reason ("invalid", "timeout", "age", …), for the summary."""
    for kind in ("invalid", "timeout", "gateway error", "duplicate", "age", "gender", "name", "description"):
        if reason.startswith(kind):
            return kind
    return reason.split(" ")[0]


def model_seed(seed: int, attempt: int) -> int:
    """A non-zero ModelConfig.seed per (run seed, try): the gateway seeds call *i* with
    ``seed * 1_000_003 + key``, and a seed of 0 would mean "unseeded"."""
    return (seed % 1_000_000) * MAX_TRIES + attempt + 1
