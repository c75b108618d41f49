"""`populace personas generate`: turn a population config into a personas JSONL file.

Two ways to build a persona from a sampled profile:

* **template** — fixed rules, no LLM (:func:`populace.population.template_records`); 100,000
  personas take about two seconds.
* **LLM** (``local``: SmolLM2 on llama.cpp; ``sim`` / ``openai``: whatever replicas of that
  backend the stack at ``--nats`` has) — a meta-prompt asks the model for a persona
  consistent with the profile, as JSON matching a per-profile schema, through the inference
  gateway (``llm.infer`` request/reply carrying an :class:`~populace.core.contracts.InferBatch`).
  Without ``--nats`` a private stack (embedded NATS, the services, ``replicas`` llama.cpp or
  sim replicas; logs and DuckDB file in a temporary directory) is started and stopped around
  the run.

The LLM path, per persona (all personas concurrently, with a progress bar):

1. **Prompt** — :data:`SYSTEM_PROMPT` (the same for every request, so replicas reuse its KV
   cache) and :func:`user_prompt` (the profile's attributes, one per line, then "Write the
   persona of this 40-year-old man as JSON."). The answer schema (:func:`persona_schema`) is
   ``{gender, age, name, description}``, all required; ``age`` is an integer between the
   profile's :func:`age_bounds` (the value itself for a numeric age, a range like ``"25-34"``
   for a categorical one, else 18-90) and ``gender``, when the profile has one, is that
   value. Prompts sharing a schema are sent together, at most ``concurrency`` per InferBatch
   (``batch_id`` unique, ``run_id`` ``personas-<hash>``, ``keys`` the persona indexes).
2. **Grammar** — bounds and fixed values are also given as ``enum``, the name and the
   description as ``pattern`` (:data:`NAME_PATTERN`, :data:`DESCRIPTION_PATTERN`). llama.cpp
   turns the schema into a grammar that (unlike the gateway's own check) understands these,
   so even SmolLM2-135M writes the right age and gender, a "First Last" name and a 40-200
   character description without braces or placeholders, and its answer always ends.
3. **Validity** — the gateway checks each answer against the schema (re-asking once);
   ``InferReply.valid[i]`` says whether answer *i* satisfied it.
4. **Consistency** (:func:`consistency_problem`) — age inside the bounds, gender equal to the
   profile's (synonyms such as woman/female accepted), a plausible name, a description of
   at least five words that states no other age ("a 16-year-old", "in his fifties"), whose
   pronouns do not contradict the profile's gender, that reads as prose and that does not
   repeat the instructions.
5. **De-duplication** — by :func:`dedupe_key`, the normalised ``(name, description)``
   (case, accents, punctuation and spacing ignored). The first persona with a key keeps it.
6. **Retries regenerate** — an invalid, inconsistent or duplicate answer is *not* re-parsed:
   a new request is sent with another sampling seed and a higher temperature
   (:data:`TEMPERATURES`), up to :data:`MAX_TRIES` tries in all. After the last failed try the
   persona is built by the template rules (:func:`fallback_persona`) and marked
   ``provenance.mode = "template-fallback"`` with the ``reason`` of the last failure.

``--unique K`` (:func:`assign_unique`) generates K personas for K representative profiles and
gives each of the N agents the persona of a representative with the same categorical
attributes whenever K is at least the number of categorical combinations, and otherwise
matches attributes in declaration order (the first one, e.g. education, as long as K is at
least its number of values). Each agent keeps its own sampled profile in the output, so the
quotas stay exact; the persona's own fields (its age, say) are its representative's.

Output: one JSON object per line, ``{"profile", "persona", "provenance"}`` (see
:mod:`populace.population.personas`). LLM provenance: ``mode`` ("llm"), ``prompt_version``
(:data:`PROMPT_VERSION`), ``model`` (the replicas' model id), ``backend``, ``seed`` (the run
seed), ``sampling_seed`` and ``temperature`` of the accepted answer, ``attempts``,
``rejected`` (why earlier tries were not kept), ``config_hash``, ``population``, ``run_id``,
``index``; with ``--unique`` also ``unique``, ``persona_index``, ``persona_profile`` and
``same_categories``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import time
import unicodedata
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from populace.population.personas import AGE_KEYS, GENDER_KEYS, find_attribute, gender_class
from populace.population import (
    TEMPLATE_PROMPT_VERSION,
    CategoricalAttribute,
    ConditionalAttribute,
    NumericAttribute,
    PopulationConfig,
    PopulationError,
    config_hash,
    largest_remainder,
    load_population,
    persona_record,
    sample_profiles,
    template_persona,
    template_records,
    write_jsonl,
)

__all__ = [
    "DEFAULT_AGE_BOUNDS",
    "LLM_MODELS",
    "MAX_TRIES",
    "MODELS",
    "PROMPT_VERSION",
    "SYSTEM_PROMPT",
    "GenerateResult",
    "PersonaGenerationError",
    "PopulationError",
    "Assignment",
    "age_bounds",
    "assign_unique",
    "attribute_kinds",
    "consistency_problem",
    "dedupe_key",
    "fallback_persona",
    "generate",
    "parse_persona",
    "persona_schema",
    "profile_gender",
    "user_prompt",
]

PROMPT_VERSION = "persona-v1"
"""Bumped whenever the meta-prompt, the schema or the checks change."""

MODELS = ("template", "local", "sim", "openai")
LLM_MODELS = ("local", "sim", "openai")
DEFAULT_AGE_BOUNDS = (18, 90)
MAX_TRIES = 3
TEMPERATURES = (0.7, 0.9, 1.0)  # per try: a regeneration samples more freely
MAX_TOKENS = 160
REQUEST_TIMEOUT_S = 900.0  # one InferBatch; the gateway bounds each call itself
MAX_INFLIGHT_BATCHES = 64
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


class PersonaGenerationError(RuntimeError):
    """The LLM path could not run at all (no gateway, no replica, stack failed to start)."""


@dataclass
class GenerateResult:
    """What `populace personas generate` did, for the CLI to print."""

    count: int  # records written (agents)
    path: Path
    seconds: float
    model: str  # the --model asked for: template, local, sim or openai
    model_id: str | None = None  # replica model id(s) that answered (LLM modes)
    unique: int = 0  # personas actually generated (K with --unique, else count)
    category_attribute: str | None = None  # the first categorical attribute
    categories: dict[str, int] = field(default_factory=dict)  # its value -> agents
    llm: int = 0  # generated personas that came from the LLM (provenance.mode == "llm")
    llm_valid_first_try: int = 0  # accepted on the first try: valid, consistent, not a duplicate
    regenerated: int = 0  # regeneration requests sent (one per re-asked persona and try)
    fallbacks: int = 0  # personas built by the template after MAX_TRIES failed tries
    duplicates_removed: int = 0  # answers rejected as duplicates (and regenerated)
    fallback_reasons: dict[str, int] = field(default_factory=dict)  # reason kind -> personas

    @property
    def llm_share(self) -> float:
        """Share of generated personas that came from the LLM (0 for template mode)."""
        return self.llm / self.unique if self.unique else 0.0


# --------------------------------------------------------------------------- pure parts

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
    age outside the bounds ("a 16-year-old", "in his late fifties") and, when the profile has a gender, does not use only the other
    gender's pronouns or nouns (she/her/woman… vs he/his/man…), reads as prose (no markup,
    brackets, placeholders, links or run-on "words" over 20 letters) and does not repeat
    the instructions ("first and last name", "the profile", …).
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
    if attribute is None:
        return {}
    return dict(Counter(str(p.get(attribute)) for p in profiles))


def _reason_kind(reason: str) -> str:
    for kind in ("invalid", "timeout", "gateway error", "duplicate", "age", "gender", "name", "description"):
        if reason.startswith(kind):
            return kind
    return reason.split(" ")[0]


def _model_seed(seed: int, attempt: int) -> int:
    """A non-zero ModelConfig.seed per (run seed, try): the gateway seeds call *i* with
    ``seed * 1_000_003 + key``, and a seed of 0 would mean "unseeded"."""
    return (seed % 1_000_000) * MAX_TRIES + attempt + 1


# --------------------------------------------------------------------------- the LLM path

@dataclass
class _Outcome:
    persona: dict | None = None
    attempts: int = 0
    first_try: bool = False
    sampling_seed: int | None = None
    temperature: float | None = None
    reason: str | None = None
    rejected: list[str] = field(default_factory=list)  # why each earlier try was not kept


class _LlmGenerator:
    """Generates personas for ``profiles`` through the gateway on ``nc``."""

    def __init__(self, nc, profiles: Sequence[dict], backend: str, seed: int, run_id: str,
                 concurrency: int, on_done: Callable[[], None]) -> None:
        self.nc, self.profiles, self.backend, self.seed = nc, profiles, backend, seed
        self.run_id, self.concurrency, self.on_done = run_id, concurrency, on_done
        self.outcomes = [_Outcome() for _ in profiles]
        self.seen: dict[tuple[str, str], int] = {}
        self.regenerated = 0
        self.duplicates_removed = 0
        self.session = uuid.uuid4().hex[:8]
        self.batches = 0
        self.sem = asyncio.Semaphore(MAX_INFLIGHT_BATCHES)
        self.tasks: set[asyncio.Task] = set()
        self.fatal: BaseException | None = None

    async def run(self) -> list[_Outcome]:
        self._submit(list(range(len(self.profiles))), 0)
        while self.tasks:
            done, _ = await asyncio.wait(self.tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                self.tasks.discard(t)
                if (err := t.exception()) is not None and self.fatal is None:
                    self.fatal = err
            if self.fatal is not None:
                for t in self.tasks:
                    t.cancel()
                await asyncio.gather(*self.tasks, return_exceptions=True)
                raise self.fatal
        return self.outcomes

    def _submit(self, indexes: list[int], attempt: int) -> None:
        """One batch per (schema, chunk of `concurrency`): prompts sharing a schema together."""
        by_schema: dict[str, list[int]] = {}
        for i in indexes:
            key = json.dumps(persona_schema(self.profiles[i]), sort_keys=True)
            by_schema.setdefault(key, []).append(i)
        for group in by_schema.values():
            for start in range(0, len(group), self.concurrency):
                chunk = group[start:start + self.concurrency]
                self.tasks.add(asyncio.create_task(self._batch(chunk, attempt)))

    async def _batch(self, indexes: list[int], attempt: int) -> None:
        from nats.errors import NoRespondersError, TimeoutError as NatsTimeout

        from populace.core import bus, subjects
        from populace.core.contracts import InferBatch, InferReply, ModelConfig

        self.batches += 1
        model = ModelConfig(backend=self.backend, seed=_model_seed(self.seed, attempt),
                            temperature=TEMPERATURES[min(attempt, len(TEMPERATURES) - 1)],
                            max_tokens=MAX_TOKENS)
        batch = InferBatch(
            batch_id=f"{self.run_id}-{self.session}-{self.batches}", run_id=self.run_id,
            round=attempt + 1, model=model, max_value=100.0, system=SYSTEM_PROMPT,
            keys=indexes, prompts=[user_prompt(self.profiles[i]) for i in indexes],
            response_schema=persona_schema(self.profiles[indexes[0]]),
        )
        texts: list[str] = [""] * len(indexes)
        valid = [False] * len(indexes)
        error: str | None = None
        async with self.sem:
            try:
                msg = await self.nc.request(subjects.LLM_INFER, bus.encode(batch), timeout=REQUEST_TIMEOUT_S)
            except NoRespondersError:
                raise PersonaGenerationError(
                    "no inference gateway answers llm.infer on this NATS server "
                    "(start a stack with `populace up`, or leave out --nats)") from None
            except (NatsTimeout, asyncio.TimeoutError):
                error = f"timeout: no reply in {REQUEST_TIMEOUT_S:.0f}s"
            else:
                reply = InferReply.model_validate_json(msg.data)
                if reply.error is not None:
                    error = f"gateway error: {reply.error}"
                elif len(reply.texts) != len(indexes):
                    error = f"gateway error: {len(reply.texts)} answers for {len(indexes)} prompts"
                else:
                    texts = reply.texts
                    valid = reply.valid or [False] * len(indexes)
        retry: list[int] = []
        for pos, i in enumerate(indexes):
            out = self.outcomes[i]
            out.attempts = attempt + 1
            reason = error
            persona = None
            if reason is None:
                persona = parse_persona(texts[pos]) if valid[pos] else None
                if persona is None:
                    reason = f"invalid answer: {texts[pos][:120]!r}"
                else:
                    reason = consistency_problem(persona, self.profiles[i])
            if reason is None:
                key = dedupe_key(persona)  # type: ignore[arg-type]
                if key in self.seen and self.seen[key] != i:
                    self.duplicates_removed += 1
                    reason = f"duplicate of persona {self.seen[key]}"
                else:
                    self.seen[key] = i
            if reason is None:
                out.persona, out.reason = persona, None
                out.first_try = attempt == 0
                out.sampling_seed = model.seed * 1_000_003 + i
                out.temperature = model.temperature
                self.on_done()
            else:
                out.reason = reason
                out.rejected.append(reason)
                if attempt + 1 < MAX_TRIES:
                    retry.append(i)
                else:
                    self.on_done()
        if retry:
            self.regenerated += len(retry)
            self._submit(retry, attempt + 1)


async def _replica_models(nc, backend: str) -> list[str]:
    from populace.core import bus, subjects
    from populace.core.contracts import ReplicaInfo

    try:
        entries = await bus.registry_entries(nc.jetstream(), subjects.REPLICAS_BUCKET, ReplicaInfo)
    except Exception:  # noqa: BLE001 - no bucket: no replicas
        return []
    return sorted({e.model for e in entries if e.backend == backend})


async def _generate_llm(url: str, profiles: Sequence[dict], backend: str, seed: int, run_id: str,
                        concurrency: int, progress) -> tuple[list[_Outcome], _LlmGenerator, str]:
    from populace.core import bus

    errors: list[str] = []

    async def remember(err: Exception) -> None:  # instead of nats-py's traceback per retry
        errors.append(f"{type(err).__name__}: {err}")

    try:
        nc = await asyncio.wait_for(bus.connect(url, "populace-personas", error_cb=remember), 10)
    except Exception as err:  # noqa: BLE001 - any connection failure is reported the same way
        last = errors[-1] if errors else f"{type(err).__name__}: {err}"
        raise PersonaGenerationError(f"cannot connect to NATS at {url}: {last}") from None
    try:
        models = await _replica_models(nc, backend)
        if not models:
            raise PersonaGenerationError(
                f"no {backend!r} LLM replica is registered on {url} "
                f"(start one with `populace replicas {backend} --nats {url}`, or leave out --nats)")
        task = progress.add_task(f"personas ({backend})", total=len(profiles))
        gen = _LlmGenerator(nc, profiles, backend, seed, run_id, concurrency,
                            on_done=lambda: progress.advance(task))
        outcomes = await gen.run()
        return outcomes, gen, "+".join(models)
    finally:
        await nc.close()


def _stop_stack(stack) -> None:
    """Stop the private stack. The replica launcher gets SIGINT first: on SIGINT it
    deregisters its replicas and exits in well under a second, whereas on SIGTERM (what
    `Stack.stop` sends) its NATS client is torn down before the deregistration, which then
    waits out a 5 s request timeout per replica."""
    import signal
    import subprocess

    for key, proc in stack.procs.items():
        if key.startswith("replicas-") and proc.poll() is None and not _ignores_sigint(proc.pid):
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass  # Stack.stop() escalates
    stack.stop()


def _ignores_sigint(pid: int) -> bool:
    """True when the process ignores SIGINT (inherited from a parent started in the
    background by a shell). Linux only; elsewhere assume it does not."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << 1))  # bit 1 = signal 2
    except (OSError, ValueError, IndexError):
        pass
    return False


def _default_replicas() -> int:
    """One single-threaded llama.cpp replica per core (at most 4): for a 135M model this beats
    fewer replicas with more threads (measured on 2 cores: 29 vs 19 tokens/s per call)."""
    return max(1, min(os.cpu_count() or 1, 4))


# --------------------------------------------------------------------------- entry point

def generate(config_path: Path, out: Path, count: int | None, model: str, unique: int | None,
             seed: int | None, nats: str | None, concurrency: int, show_progress: bool,
             *, replicas: int | None = None) -> GenerateResult:
    """Build personas for the population at ``config_path`` and write them to ``out``.

    ``count`` overrides the config's total; ``model`` is one of :data:`MODELS`; ``unique``
    generates that many personas and shares them out (:func:`assign_unique`); ``seed``
    overrides the config's seed (profiles and LLM sampling); ``nats`` is the URL of a running
    stack (LLM modes; None starts a private stack with ``replicas`` llama.cpp/sim replicas,
    default one per core, at most 4); ``concurrency`` is the most prompts per InferBatch.

    Raises :class:`PopulationError` for a bad config (message names the field),
    :class:`ValueError` for a bad option (message names ``--count``/``--unique``/``--model``/
    ``--concurrency``) and :class:`PersonaGenerationError` when the LLM path cannot run.
    """
    t0 = time.perf_counter()
    if model not in MODELS:
        raise ValueError(f"--model must be one of {', '.join(MODELS)} (got {model!r})")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError(f"--count must be an integer >= 1 (got {count!r})")
    if unique is not None and (isinstance(unique, bool) or not isinstance(unique, int) or unique < 1):
        raise ValueError(f"--unique must be an integer >= 1 (got {unique!r})")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"--concurrency must be an integer >= 1 (got {concurrency!r})")
    cfg = load_population(config_path)
    n = cfg.total if count is None else count
    if unique is not None and unique > n:
        raise ValueError(f"--unique {unique} is more than the {n} agents (--count or the config's total)")
    if model == "openai" and nats is None:
        raise ValueError("--model openai needs --nats URL of a stack with registered openai replicas")
    s = cfg.seed if seed is None else seed
    cats, nums = attribute_kinds(cfg)
    first_cat = cats[0] if cats else None
    profiles = sample_profiles(cfg, n, seed=s)
    out = Path(out)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from populace.cli.display import console

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, disable=not show_progress)
    result = GenerateResult(count=n, path=out, seconds=0.0, model=model, unique=unique or n,
                            category_attribute=first_cat, categories=category_counts(profiles, first_cat))

    if model == "template" and unique is None:
        with progress:
            task = progress.add_task("personas (template)", total=n)

            def counted():
                for i, rec in enumerate(template_records(cfg, seed=s, profiles=profiles), 1):
                    if i % 5000 == 0:
                        progress.update(task, completed=i)
                    yield rec
                progress.update(task, completed=n)

            write_jsonl(out, counted())
        result.seconds = time.perf_counter() - t0
        return result

    assignment = assign_unique(profiles, unique, cats, nums) if unique is not None else None
    gen_profiles = [profiles[r] for r in assignment.reps] if assignment else profiles
    chash = config_hash(cfg)
    base = {"config_hash": chash, "population": cfg.name, "seed": s}

    if model == "template":
        personas = [template_persona(p, j, s) for j, p in enumerate(gen_profiles)]
        provs = [{"mode": "template", "prompt_version": TEMPLATE_PROMPT_VERSION, "model": None, **base}
                 for _ in gen_profiles]
    else:
        personas, provs = _llm_personas(cfg, model, gen_profiles, s, nats, concurrency, progress,
                                        result, base, unique, replicas)

    records = []
    for i, profile in enumerate(profiles):
        j = assignment.persona_of[i] if assignment else i
        prov = {**provs[j], "index": i}
        if assignment:
            prov.update(unique=unique, persona_index=j, persona_profile=gen_profiles[j],
                        same_categories=assignment.exact[i])
        records.append(persona_record(profile, personas[j], prov))
    write_jsonl(out, records)
    result.seconds = time.perf_counter() - t0
    return result


def _llm_personas(cfg: PopulationConfig, backend: str, gen_profiles: list[dict], seed: int,
                  nats: str | None, concurrency: int, progress, result: GenerateResult,
                  base: dict, unique: int | None, replicas: int | None) -> tuple[list[dict], list[dict]]:
    run_key = json.dumps([base["config_hash"], len(gen_profiles), seed, unique, backend, PROMPT_VERSION])
    run_id = "personas-" + hashlib.sha256(run_key.encode()).hexdigest()[:12]
    stack = None
    tmp = None
    url = nats
    if url is None:
        from populace.cli.stack import Stack, StackError

        count = replicas or _default_replicas()
        tmp = tempfile.mkdtemp(prefix="populace-personas-")
        stack = Stack(hosts=0, db=str(Path(tmp) / "personas.duckdb"), env={"POPULACE_STORAGE": "memory"},
                      log_dir=str(Path(tmp) / "logs"),
                      extra={f"replicas-{backend}": ["replicas", backend, "--count", str(count)]},
                      replicas=count)
    ok = False
    try:
        with progress:
            if stack is not None:
                starting = progress.add_task(f"starting NATS, gateway and {stack.replicas} {backend} replica(s)",
                                             total=None)
                try:
                    stack.start()
                    asyncio.run(stack.wait_ready(timeout=180))
                except StackError as err:
                    raise PersonaGenerationError(f"could not start the local stack: {err}") from None
                progress.update(starting, total=1, completed=1)
                url = stack.url
            outcomes, gen, model_id = asyncio.run(
                _generate_llm(url, gen_profiles, backend, seed, run_id, concurrency, progress))  # type: ignore[arg-type]
        ok = True
    finally:
        if stack is not None:
            _stop_stack(stack)
        if tmp is not None and ok:  # on failure the service logs stay for the error message
            shutil.rmtree(tmp, ignore_errors=True)

    personas, provs = [], []
    reasons: Counter[str] = Counter()
    for j, (profile, o) in enumerate(zip(gen_profiles, outcomes)):
        common = {"backend": backend, **base, "attempts": o.attempts, "run_id": run_id}
        if o.rejected:
            common["rejected"] = o.rejected
        if o.persona is not None:
            personas.append(o.persona)
            provs.append({"mode": "llm", "prompt_version": PROMPT_VERSION, "model": model_id, **common,
                          "sampling_seed": o.sampling_seed, "temperature": o.temperature})
            result.llm += 1
            result.llm_valid_first_try += o.first_try
        else:
            personas.append(fallback_persona(profile, j, seed))
            provs.append({"mode": "template-fallback", "prompt_version": TEMPLATE_PROMPT_VERSION,
                          "model": None, "llm_model": model_id, "llm_prompt_version": PROMPT_VERSION, **common,
                          "reason": o.reason or "no answer"})
            result.fallbacks += 1
            reasons[_reason_kind(o.reason or "no answer")] += 1
    result.model_id = model_id
    result.regenerated = gen.regenerated
    result.duplicates_removed = gen.duplicates_removed
    result.fallback_reasons = dict(reasons)
    return personas, provs
