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


# Chain of thought as the platform asks for it (a scenario's `model.answer: cot`): what the run's
# system prompt gains, and the property its answer schema gains first, so the model thinks before
# it commits to the fields the simulation reads (its parser never sees "reasoning").
COT_INSTRUCTION = ('Think step by step first: write your thinking in the JSON answer\'s "reasoning" field, '
                   "before the other fields.")
REASONING = "reasoning"


def structured(properties: dict, *, reasoning: bool = False) -> dict:
    """An answer schema: one JSON object with these properties, all required, e.g.
    `structured({"give": {"type": "integer", "minimum": 0}})`. `reasoning`: a "reasoning" text
    first (what the platform adds itself in a chain-of-thought run)."""
    props = {REASONING: {"type": "string"}, **properties} if reasoning else dict(properties)
    return {"type": "object", "properties": props, "required": list(props)}


def reasons_itself(schema: object) -> bool:
    """Whether an answer schema already asks for its own "reasoning" (a simulation that writes
    its chain of thought by hand): the platform then adds nothing."""
    return isinstance(schema, dict) and isinstance(schema.get("properties"), dict) and REASONING in schema["properties"]


def with_reasoning(schema: object) -> dict:
    """An object answer schema with "reasoning" first (kept as it is when it has one). ValueError
    for a schema that is not a JSON object with properties: a bare answer has nowhere to think."""
    if reasons_itself(schema):
        return schema  # type: ignore[return-value]
    if not (isinstance(schema, dict) and schema.get("type") == "object" and isinstance(schema.get("properties"), dict)):
        raise ValueError("model.answer: chain of thought (cot) puts a \"reasoning\" field first in the answer's JSON "
                         f"object, but this simulation's answer_schema() is {_shown(schema)}, not an object with "
                         "properties; use answer: direct, or give the simulation an object schema")
    required = schema.get("required")
    required = [REASONING, *(r for r in required if r != REASONING)] if isinstance(required, list) else [REASONING]
    return {**schema, "properties": {REASONING: {"type": "string"}, **schema["properties"]}, "required": required}


def with_cot_instruction(system: str) -> str:
    """The run's system prompt with the chain-of-thought instruction after it."""
    return f"{system} {COT_INSTRUCTION}" if system else COT_INSTRUCTION


def _shown(schema: object) -> str:
    text = json.dumps(schema) if schema is not None else "None"
    return text if len(text) <= 80 else text[:77] + "..."
