"""Seeds that are the same in every process. Python's `hash(str)` is salted per process
(PYTHONHASHSEED), so a seed built from it differs between an agent-host and the local runner and
shows only on the fleet; these hash the salt's text with blake2b instead.

    rng = self.sim.rng(round, self.id, "partner")   # a random.Random, the same everywhere
"""

from __future__ import annotations

import hashlib
import random


def stable_seed(*salt: object) -> int:
    """A 64-bit seed from ints, strings, floats, bools and None (and tuples of them)."""
    return int.from_bytes(hashlib.blake2b(_text(salt).encode(), digest_size=8).digest(), "little")


def _text(value: object) -> str:
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(_text(v) for v in value) + ")"
    if value is None or isinstance(value, (bool, int, float, str)):
        return f"{type(value).__name__}:{value!r}"
    raise TypeError(f"a seed's salt takes ints, strings, floats, bools and None, not {type(value).__name__}")


def seeded(*salt: object) -> random.Random:
    return random.Random(stable_seed(*salt))
