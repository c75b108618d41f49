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
