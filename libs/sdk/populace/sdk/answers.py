"""Reading a structured answer: what an agent's parser starts from.

    value = answer_field(text, "guess")   # {"guess": 42} -> 42; " 42 " -> "42"; "" -> None

A structured call answers `{"guess": 42}` (or `{"reasoning": "…", "guess": 42}`); a backend
that ignores the schema may answer `42` bare. The simulation then checks the value against
its own rules (type, range, options) and never invents one: whatever does not pass is the
agent's invalid answer, with its raw text kept.
"""

from __future__ import annotations

import json


def answer_field(text: str, name: str) -> object:
    """The value of `name` in a JSON-object answer (any JSON type; None when the field is
    missing). An answer that is not a JSON object comes back as its stripped text — a bare
    answer, or JSON that does not parse, which the caller's own check then refuses. None for
    an empty answer."""
    s = text.strip()
    if not s:
        return None
    if s[0] == "{":
        try:
            obj = json.loads(s)
        except ValueError:
            return s
        return obj.get(name) if isinstance(obj, dict) else None
    return s


def schema_options(schema: object) -> dict[str, tuple]:
    """The options an answer schema declares, by the answer's field: each property's `enum` (of
    an object schema), e.g. {"move": ("go", "stay")}; a bare answer's own `enum` under "". What
    the platform holds a same-named outcome column to (populace.sdk.play): a value outside them
    is the model's invalid answer, however the simulation's parser let it through."""
    if not isinstance(schema, dict):
        return {}
    out: dict[str, tuple] = {}
    if _scalars(schema.get("enum")):
        out[""] = tuple(dict.fromkeys(schema["enum"]))
    props = schema.get("properties")
    if isinstance(props, dict):
        for name, sub in props.items():
            if isinstance(name, str) and isinstance(sub, dict) and _scalars(sub.get("enum")):
                out[name] = tuple(dict.fromkeys(sub["enum"]))
    return out


def _scalars(options: object) -> bool:
    return isinstance(options, list) and bool(options) and all(
        isinstance(o, (str, int, float)) for o in options)
