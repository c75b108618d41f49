"""Invariants: rules an environment declares on its world (and state) that the platform checks
after `start_world` and after every `decide` — where the round is decided, so the same in one
process and on the fleet. A rule that breaks stops the run naming the rule, the round and a
witness; the run pauses, and a resume after the fix replays the round.

    from populace.sdk.rules import invariant

    class SugarEnv(Env):
        @invariant("each living agent on its own cell")
        def own_cell(self, state, world):
            return self.grid.misplaced(world.cell, world.occupant, alive=world.alive)

A check takes (state, world) — the state and world after the round (world None for a
simulation without one) — and returns what breaks the rule, or nothing:

- None, True, or an empty array, list or text: the rule holds;
- a non-empty array or list (e.g. the agents that break it): broken, its first values are the
  witness; a text: broken, the text is the witness; False: broken, with no witness.

Checks run once per round over whole columns: keep them vectorised (numpy), never a loop over
agents. A check that raises stops the run the same way, naming the rule and what it raised."""

from __future__ import annotations

from collections.abc import Callable
from numbers import Number
from typing import Any

import numpy as np

_MARK = "__populace_invariant__"
SHOWN = 5  # values of a witness named in the message


class InvariantError(ValueError):
    """A declared invariant that broke or raised (its message names it and the witness)."""


def invariant(name: str) -> Callable[[Callable], Callable]:
    """Declare an Env method `(self, state, world) -> witness or None` as an invariant named `name`."""
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"invariant(name): a short sentence naming the rule, not {name!r}")

    def mark(fn: Callable) -> Callable:
        setattr(fn, _MARK, name.strip())
        return fn

    return mark


def declared(env_cls: type) -> list[tuple[str, str]]:
    """(the rule's name, the method's name) of every invariant a class declares, its bases'
    first (a subclass's method of the same name replaces its base's)."""
    found: dict[str, str] = {}
    for klass in reversed(env_cls.__mro__):
        for attr, value in vars(klass).items():
            name = getattr(value, _MARK, None)
            if isinstance(name, str):
                found[attr] = name
            elif attr in found:
                del found[attr]  # overridden by a method that is not an invariant
    return [(name, attr) for attr, name in found.items()]


def witness(result: Any) -> str | None:
    """None when a check's result says the rule holds, else the witness as text."""
    if result is None:
        return None
    if isinstance(result, (bool, np.bool_)):
        return None if result else "no witness given"
    if isinstance(result, str):
        return result or None
    if isinstance(result, (np.ndarray, list, tuple, set, frozenset)):
        values = np.asarray(sorted(result) if isinstance(result, (set, frozenset)) else result, dtype=object)
        values = values.reshape(-1)
        if values.size == 0:
            return None
        shown = ", ".join(str(v.item() if isinstance(v, np.generic) else v) for v in values[:SHOWN])
        more = f" (and {values.size - SHOWN:,} more)" if values.size > SHOWN else ""
        return f"[{shown}]{more}"
    if isinstance(result, (Number, np.number)):
        return None if result == 0 else str(result)
    text = repr(result)
    return text if len(text) <= 200 else text[:199] + "…"


def check(env: Any, state: Any, world: Any, when: str) -> None:
    """Run every invariant `env` declares; InvariantError (naming the rule, `when` — e.g. "after
    round 3" — and the witness) for the first that breaks or raises."""
    for name, attr in declared(type(env)):
        try:
            seen = witness(getattr(env, attr)(state, world))
        except Exception as err:
            raise InvariantError(f"invariant {name!r} raised {when}: {type(err).__name__}: {err}") from err
        if seen is not None:
            raise InvariantError(f"invariant {name!r} is broken {when}: {seen}")


def distinct(values: np.ndarray, where: np.ndarray | None = None, what: str = "value", who: str = "rows") -> str | None:
    """A witness for "no two rows share a value" (e.g. each living agent's cell): None when it
    holds, else the smallest shared value and the rows (agent ids) holding it. Vectorised."""
    values = np.asarray(values)
    rows = np.arange(values.size) if where is None else np.flatnonzero(np.asarray(where))
    v = values[rows]
    order = np.argsort(v, kind="stable")
    s = v[order]
    same = np.flatnonzero(s[1:] == s[:-1])
    if same.size == 0:
        return None
    shared = s[same[0]]
    holders = rows[order][s == shared]
    count = np.unique(s[same]).size
    others = f" (and {count - 1:,} other {what}s)" if count > 1 else ""
    return f"{what} {shared.item()} is held by {who} {', '.join(map(str, holders[:SHOWN].tolist()))}{others}"
