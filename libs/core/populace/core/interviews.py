"""Interviews, as the platform's services need them (the SDK asks, populace.sdk.interview).
Pure.

Who answers: every agent of a run, a seeded share of them, or listed ids. A share is drawn per
(run seed, survey id, agent), never per round: a panel asks the same agents after every round.
The agent-hosts, the local runner and the recorder (which counts the answers a run owes) all
draw it here, so they agree without telling each other.

What a valid answer holds (`fits`): the recorder refuses a batch claiming a valid answer that
its question does not allow, as it refuses an outcome outside its declared range."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence

import numpy as np

from populace.core.contracts import Question

_MASK = (1 << 64) - 1


def survey_salt(survey_id: str) -> int:
    """A 64-bit number for a survey id, the same in every process (Python's hash(str) is not)."""
    return int.from_bytes(hashlib.blake2b(survey_id.encode(), digest_size=8).digest(), "little")


def draws(seed: int, salt: int, ids: np.ndarray) -> np.ndarray:
    """A uniform draw in [0, 1) per agent id: splitmix64 of (seed, salt, agent), vectorised
    (numpy's uint64 arithmetic wraps like C's)."""
    with np.errstate(over="ignore"):
        base = np.uint64((seed * 0x9E3779B97F4A7C15 + salt * 0xD6E8FEB86659FD93 + 0x2545F4914F6CDD1D) & _MASK)
        z = base + ids.astype(np.uint64) * np.uint64(0x94D049BB133111EB)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def chosen(ids: np.ndarray, *, seed: int, survey_id: str, sample: float | None = None,
           agents: Sequence[int] | None = None) -> np.ndarray:
    """Which of `ids` answer (a boolean mask): all of them, those in `agents`, or those whose
    draw falls under `sample`."""
    ids = np.asarray(ids, dtype=np.int64)
    if agents is not None:
        return np.isin(ids, np.asarray(list(agents), dtype=np.int64))
    if sample is None or sample >= 1:
        return np.ones(ids.size, dtype=bool)
    return draws(seed, survey_salt(survey_id), ids) < sample


def respondents(count: int, *, seed: int, survey_id: str, sample: float | None = None,
                agents: Sequence[int] | None = None) -> np.ndarray:
    """The sorted ids, among a run's `count` agents, that answer."""
    ids = np.arange(count, dtype=np.int64)
    return ids[chosen(ids, seed=seed, survey_id=survey_id, sample=sample, agents=agents)]


def respondent_count(count: int, *, seed: int, survey_id: str, sample: float | None = None,
                     agents: Sequence[int] | None = None) -> int:
    """How many of a run's `count` agents answer (drawn a million at a time: a run may have 10^8)."""
    if agents is not None:
        return len({a for a in agents if 0 <= a < count})
    if sample is None or sample >= 1:
        return count
    step = 1 << 20
    return sum(int(chosen(np.arange(lo, min(count, lo + step), dtype=np.int64), seed=seed, survey_id=survey_id,
                          sample=sample).sum()) for lo in range(0, count, step))


def fits(q: Question, answer: str | None, value: float | None) -> str | None:
    """Why `answer` (and its `value`) cannot be a valid answer to `q`; None when it can."""
    if answer is None:
        return "a valid answer has its text"
    if q.kind == "options":
        return None if answer in (q.options or ()) else f"{answer[:60]!r} is not one of the options"
    if q.kind == "text":
        return None if 0 < len(answer) <= (q.max_chars or 0) else f"the text is longer than {q.max_chars} characters"
    if value is None or not math.isfinite(value):
        return "a valid answer to a Likert or number question has its value"
    if q.kind == "likert":
        ok = value.is_integer() and 1 <= value <= (q.points or 0)
        return None if ok else f"{value:g} is not a point from 1 to {q.points}"
    if value < (q.min or 0.0) or value > (q.max or 0.0) or (q.integer and not value.is_integer()):
        return f"{value:g} is outside [{q.min:g}, {q.max:g}]" + (" (whole numbers)" if q.integer else "")
    return None


def owed_rounds(last_round: int, first_played: int = 1, resumed_after: int | None = None) -> tuple[range, range]:
    """(the rounds whose planned answers a run owes, those whose answers may still come).

    A run owes the answers after the rounds it played: a fork's first round is the one after
    its fork point (its parent answered the rounds before; the fork asks them of nobody). Of
    those, answers still come after the rounds its last placement plays and after the round it
    was restored from, which its shares ask again. A resume after round k (`resumed_after`)
    asks none of the rounds before k again (their answers cut short by the stop never come):
    what they lack is missing at once, not waited for."""
    owed = range(max(1, first_played), last_round + 1)
    return owed, range(max(owed.start, resumed_after or 1), last_round + 1)


def expected(plans: Sequence, agents: int, seed: int, last_round: int, first_round: int = 1,
             played: Callable[[int], np.ndarray] | None = None) -> int:
    """How many answers a run's planned interviews owe after rounds `first_round`..`last_round`:
    each plan's respondents × its questions × the rounds it is asked after. `played`: in a run
    whose population changed, round -> the ids of the agents that played it (who answer after it)."""
    total = 0
    for plan in plans:
        rounds = [r for r in plan.rounds(last_round) if r >= first_round]
        if not rounds:
            continue
        if played is None:
            who = respondent_count(agents, seed=seed, survey_id=plan.id, sample=plan.sample, agents=plan.agents)
            total += len(rounds) * who * len(plan.questions)
            continue
        for r in rounds:
            ids = played(r)
            total += int(chosen(ids, seed=seed, survey_id=plan.id, sample=plan.sample, agents=plan.agents).sum()) \
                * len(plan.questions)
    return total
