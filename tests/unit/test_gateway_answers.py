"""The gateway's answer check (populace.gateway.answers): the JSON-schema keywords it checks
(type, required, properties, minimum/maximum) and finite numbers; enum and pattern are left
to the replica's grammar and the simulation's parser."""

from __future__ import annotations

import pytest

from populace.gateway import answers

GUESS = {"type": "object", "properties": {"guess": {"type": "number", "minimum": 0, "maximum": 100}},
         "required": ["guess"]}
COUNT = {"type": "object", "properties": {"reasoning": {"type": "string"},
                                          "n": {"type": "integer", "minimum": 0, "maximum": 20}},
         "required": ["reasoning", "n"]}
CHOICE = {"type": "object", "properties": {"choice": {"type": "string", "enum": ["a", "b"]}},
          "required": ["choice"], "additionalProperties": False}


@pytest.mark.parametrize(("schema", "text", "ok"), [
    (GUESS, '{"guess": 5}', True),
    (GUESS, '{"guess": 100}', True),
    (GUESS, '{"guess": 5.5, "other": 1}', True),
    (GUESS, '{"guess": -1}', False),
    (GUESS, '{"guess": 101}', False),
    (GUESS, '{"guess": NaN}', False),
    (GUESS, '{"guess": Infinity}', False),
    (GUESS, '{"guess": 1e999}', False),  # parsed as inf
    (GUESS, '{"guess": 1' + "0" * 400 + "}", False),  # a finite int too large for a float: out of range
    (GUESS, '{"guess": "5"}', False),
    (GUESS, '{"guess": true}', False),
    (GUESS, "{}", False),
    (GUESS, "5", False),
    (GUESS, "not json", False),
    (COUNT, '{"reasoning": "r", "n": 3}', True),
    (COUNT, '{"reasoning": "r", "n": 3.0}', True),
    (COUNT, '{"reasoning": "r", "n": 3.5}', False),
    (COUNT, '{"reasoning": 1, "n": 3}', False),
    (COUNT, '{"n": 3}', False),
    (CHOICE, '{"choice": "c", "x": 1}', True),  # enum and additionalProperties: not the gateway's to check
    (CHOICE, '{"choice": 1}', False),
    (None, " x ", True),
    (None, "  ", False),
])
def test_check(schema, text, ok):
    assert answers.check(text, schema) is ok
