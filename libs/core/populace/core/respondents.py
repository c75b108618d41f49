"""Who answers an interview: every agent of a run, a seeded share of them, or listed ids. Pure.

A share is drawn per (run seed, survey id, agent), never per round: a panel asks the same
agents after every round. The agent-hosts, the local runner and the recorder (which counts
the answers a run owes) all draw it here, so they agree without telling each other."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

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
