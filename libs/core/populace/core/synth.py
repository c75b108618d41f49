"""Deterministic answers that satisfy a JSON schema, for the paper's dummy benchmark, the
simulated replicas and local test runs. Pure.

The answer for an agent depends only on (seed, round, key) and the schema — never on how
requests were batched, which process asked or which host the agent lives on — so a run on
the dummy model gives identical results in one process and on the fleet.

Only what structured answers use is covered: objects, numbers and integers (with
minimum/maximum/exclusive bounds), strings (with `enum`), booleans, `const` and `enum` at any
type. Every value that needs a random draw takes the next stream in property order; strings
without an enum take none, so `{"reasoning", "guess"}` draws its guess exactly as `{"guess"}`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import lru_cache

_MASK = (1 << 64) - 1
DEFAULT_MAX = 100  # a number without a maximum is drawn from [minimum, minimum + 100]


def call_seed(seed: int, seq: int) -> int:
    """The seed of an agent's `seq`-th model call in a round (0: its first, seeded exactly as one
    call per round always was), so an agent that asks twice in a round gets two draws."""
    return seed if seq == 0 else (seed ^ (seq * 0xD1B54A32D192ED03)) & _MASK


def seeded_value(seed: int, round_: int, key: int, max_value: int) -> int:
    """splitmix64 of (seed, round, key) → an integer in [0, max_value]."""
    z = (seed * 0x9E3779B97F4A7C15 + round_ * 0xBF58476D1CE4E5B9 + key * 0x94D049BB133111EB) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    z ^= z >> 31
    return z % (max_value + 1)


class _Draws:
    """Stream i of (seed, round, key): stream 0 is seeded_value itself."""

    __slots__ = ("i", "key", "round", "seed")

    def __init__(self, seed: int, round_: int, key: int) -> None:
        self.seed, self.round, self.key, self.i = seed, round_, key, 0

    def next(self, top: int) -> int:
        seed = self.seed if self.i == 0 else (self.seed + self.i * 0x2545F4914F6CDD1D) & _MASK
        self.i += 1
        return seeded_value(seed, self.round, self.key, max(0, top))


def _bounds(schema: dict) -> tuple[int, int]:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    low = math.ceil(lo) if isinstance(lo, (int, float)) else 0
    if isinstance(xlo, (int, float)):
        low = max(low, math.floor(xlo) + 1)
    high = math.floor(hi) if isinstance(hi, (int, float)) else low + DEFAULT_MAX
    if isinstance(xhi, (int, float)):
        high = min(high, math.ceil(xhi) - 1)
    return low, max(low, high)


# A schema is compiled once into a renderer: a function of the draws that writes the JSON text
# directly. Answering a million requests per round through json.dumps of a fresh dict cost
# the gateway 3 µs per answer; the compiled form costs a fraction of that, with the same text.
Render = Callable[[_Draws], str]


def _compile(schema: object) -> Render:
    if not isinstance(schema, dict):
        return lambda d: "null"
    if "const" in schema:
        text = json.dumps(schema["const"])
        return lambda d: text
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        options = [json.dumps(o) for o in schema["enum"]]
        top = len(options) - 1
        return lambda d: options[d.next(top)]
    kind = schema.get("type")
    if isinstance(kind, list):  # e.g. ["number", "null"]: the first concrete type
        kind = next((k for k in kind if k != "null"), None)
    if kind == "object":
        props = schema.get("properties") or {}
        parts = [(json.dumps(name) + ": ", _compile(sub)) for name, sub in props.items()]
        return lambda d: "{" + ", ".join(head + render(d) for head, render in parts) + "}"
    if kind in ("number", "integer"):
        low, high = _bounds(schema)
        span = high - low
        return lambda d: str(low + d.next(span))
    if kind == "boolean":
        return lambda d: "true" if d.next(1) == 1 else "false"
    if kind == "array":
        return lambda d: "[]"
    if kind == "string":
        return lambda d: '"(dummy)"'
    return lambda d: "null"


_CONST, _NUMBER, _CHOICE = 0, 1, 2


def _flat(schema: dict) -> Callable[[int, int, int], str] | None:
    """The common case on the hot path — an object of scalar properties ({"guess": n},
    {"reasoning", "choice"}) — as one loop over precomputed steps, without a draws object or
    closures per value. None for anything else (the general renderer handles it)."""
    if schema.get("type") != "object" or "const" in schema or "enum" in schema:
        return None
    steps = []  # (head, kind, low, span, texts)
    for name, sub in (schema.get("properties") or {}).items():
        head = json.dumps(name) + ": "
        if not isinstance(sub, dict) or "const" in sub:
            steps.append((head, _CONST, 0, 0, json.dumps(sub.get("const")) if isinstance(sub, dict) else "null"))
            continue
        if isinstance(sub.get("enum"), list) and sub["enum"]:
            steps.append((head, _CHOICE, 0, len(sub["enum"]) - 1, [json.dumps(o) for o in sub["enum"]]))
            continue
        kind = sub.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), None)
        if kind in ("number", "integer"):
            low, high = _bounds(sub)
            steps.append((head, _NUMBER, low, high - low, None))
        elif kind == "boolean":
            steps.append((head, _CHOICE, 0, 1, ["false", "true"]))
        elif kind == "string":
            steps.append((head, _CONST, 0, 0, '"(dummy)"'))
        else:
            return None

    def render(seed: int, round_: int, key: int) -> str:
        parts = []
        i = 0
        for head, kind, low, span, texts in steps:
            if kind == _CONST:
                parts.append(head + texts)
                continue
            draw = seeded_value(seed if i == 0 else (seed + i * 0x2545F4914F6CDD1D) & _MASK, round_, key, span)
            i += 1
            parts.append(head + (str(low + draw) if kind == _NUMBER else texts[draw]))
        return "{" + ", ".join(parts) + "}"

    return render


@lru_cache(maxsize=256)
def _renderer(schema_json: str) -> Callable[[int, int, int], str]:
    schema = json.loads(schema_json)
    flat = _flat(schema) if isinstance(schema, dict) else None
    if flat is not None:
        return flat
    render = _compile(schema)
    return lambda seed, round_, key: render(_Draws(seed, round_, key))


def renderer(schema: dict | None) -> Callable[[int, int, int], str]:
    """`render(seed, round, key)` for one schema: compile once, answer many (a batch)."""
    if schema is None:
        return lambda seed, round_, key: str(seeded_value(seed, round_, key, DEFAULT_MAX))
    return _renderer(json.dumps(schema))


def answer(schema: dict | None, seed: int, round_: int, key: int) -> str:
    """The dummy model's text for one request: JSON satisfying `schema`, or (no schema) a
    number as plain text."""
    return renderer(schema)(seed, round_, key)
