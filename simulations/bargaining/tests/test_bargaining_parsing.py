"""Parsing never guesses: a message counts only when all of `say`, `propose` and `accept` are
there and keep the rules."""

from __future__ import annotations

import pytest
from populace_bargaining.parsing import Parsed, parse_message


@pytest.mark.parametrize(("text", "parsed"), [
    ('{"say": "Half?", "propose": 5, "accept": false}', Parsed("Half?", 5, False)),
    ('  {"say": "  ok  ", "propose": 0, "accept": true} ', Parsed("ok", 0, True)),
    ('{"reasoning": "…", "say": "", "propose": 10, "accept": false}', Parsed("", 10, False)),
    ('{"say": "x", "propose": 4.0, "accept": false}', Parsed("x", 4, False)),
    ('{"say": "x", "propose": " 4 ", "accept": false}', Parsed("x", 4, False)),
    ('{"say": "x", "propose": 4, "accept": false, "mood": "calm"}', Parsed("x", 4, False)),
    ('{"say": "' + "y" * 20 + '", "propose": 4, "accept": false}', Parsed("y" * 20, 4, False)),
    ('{"say": "' + "y" * 21 + '", "propose": 4, "accept": false}', None),  # longer than the game allows
    ('{"say": "x", "propose": 11, "accept": false}', None),  # more than the pie
    ('{"say": "x", "propose": -1, "accept": false}', None),
    ('{"say": "x", "propose": 4.5, "accept": false}', None),  # never rounded
    ('{"say": "x", "propose": 1e999, "accept": false}', None),
    ('{"say": "x", "propose": true, "accept": false}', None),
    ('{"say": "x", "propose": "four", "accept": false}', None),
    ('{"say": "x", "propose": "99999999999999999999999", "accept": false}', None),
    ('{"say": "x", "propose": null, "accept": false}', None),
    ('{"say": "x", "accept": true}', None),  # an accept still needs its message whole
    ('{"say": "x", "propose": 4, "accept": "yes"}', None),
    ('{"say": "x", "propose": 4, "accept": 1}', None),
    ('{"say": "x", "propose": 4}', None),
    ('{"say": 5, "propose": 4, "accept": false}', None),
    ('{"propose": 4, "accept": false}', None),
    ('{"say": "x", "propose": 4, "accept": false', None),  # cut off
    ('["x", 4, false]', None),
    ("I accept your offer.", None),
    ("", None),
    ("[" * 100_000, None),
])
def test_parse_message(text, parsed):
    assert parse_message(text, 10, 20) == parsed
