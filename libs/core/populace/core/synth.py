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

_MASK = (1 << 64) - 1
DEFAULT_MAX = 100  # a number without a maximum is drawn from [minimum, minimum + 100]


def seeded_value(seed: int, round_: int, key: int, max_value: int) -> int:
    """splitmix64 of (seed, round, key) → an integer in [0, max_value]."""
    z = (seed * 0x9E3779B97F4A7C15 + round_ * 0xBF58476D1CE4E5B9 + key * 0x94D049BB133111EB) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    z ^= z >> 31
    return z % (max_value + 1)


class _Draws:
    """Stream i of (seed, round, key): stream 0 is seeded_value itself."""

    __slots__ = ("seed", "round", "key", "i")

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


def _value(schema: object, draws: _Draws) -> object:
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        options = schema["enum"]
        return options[draws.next(len(options) - 1)]
    kind = schema.get("type")
    if isinstance(kind, list):  # e.g. ["number", "null"]: the first concrete type
        kind = next((k for k in kind if k != "null"), None)
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: _value(sub, draws) for name, sub in props.items()}
    if kind in ("number", "integer"):
        low, high = _bounds(schema)
        return low + draws.next(high - low)
    if kind == "boolean":
        return draws.next(1) == 1
    if kind == "array":
        return []
    if kind == "string":
        return "(dummy)"
    return None


def answer(schema: dict | None, seed: int, round_: int, key: int) -> str:
    """The dummy model's text for one request: JSON satisfying `schema`, or (no schema) a
    number as plain text."""
    draws = _Draws(seed, round_, key)
    if schema is None:
        return str(draws.next(DEFAULT_MAX))
    return json.dumps(_value(schema, draws))
