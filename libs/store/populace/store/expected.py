"""Which outcomes a run expects: exactly one per (round, agent), from the share the run
placed those agents on, in the rounds that share plays. Pure: the store asks, the service
dead-letters what is refused. Whatever a batch's message id, extras and duplicates are
refused, so a forged or replayed batch can never add rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from populace.core.contracts import LlmCallBatch, OutcomeBatch, share_key


@dataclass(frozen=True)
class RunShape:
    """What a run's config fixes: how many agents, how many rounds."""

    agents: int
    rounds: int


def outcome_refusal(batch: OutcomeBatch, ranges: list[tuple[int, int]] | None, from_round: int,
                    shape: RunShape, recorded: np.ndarray, ids: list[int] | None = None,
                    departed: np.ndarray | None = None) -> str | None:
    """Why `batch` is refused (None: it is expected). `ranges`: its share's (first, count)
    ranges, None if the run never placed that share; `from_round`: the first round the share
    plays; `recorded`: per agent, whether the batch's round already has its outcome; `ids`: the
    agents the batch came with (None: its own), those of groups taken out of it included, so
    a batch is judged as it was sent, whatever was taken out; `departed`: per agent, the round
    after which it departed (0: alive; None: nobody did): it has no outcome in a later round."""
    key = share_key(batch.host_id, batch.epoch)
    if ranges is None:
        return f"share {key} was never placed in run {batch.run_id}"
    if batch.round > shape.rounds:
        return f"round {batch.round}: run {batch.run_id} has {shape.rounds} rounds"
    if batch.round < from_round:
        return f"share {key} plays from round {from_round}, not round {batch.round}"
    ids = np.asarray(batch.agent_ids if ids is None else ids, dtype=np.int64)
    if ids.size == 0:
        return None
    inside = np.zeros(ids.size, dtype=bool)
    for first, count in ranges:
        inside |= (ids >= first) & (ids < first + count)
    if not inside.all():
        return f"agent {int(ids[~inside][0])} is not one of share {key}'s agents"
    uniq, counts = np.unique(ids, return_counts=True)
    if uniq.size != ids.size:
        return f"agent {int(uniq[counts > 1][0])} appears twice in the batch"
    if ids.max() >= recorded.size:
        return f"agent {int(ids.max())} is not in run {batch.run_id} ({recorded.size} agent ids so far)"
    if departed is not None:
        gone = departed[np.minimum(ids, departed.size - 1)]
        late = (ids < departed.size) & (gone > 0) & (gone < batch.round)
        if late.any():
            i = int(np.flatnonzero(late)[0])
            return f"agent {int(ids[i])} departed after round {int(gone[i])}: it has no outcome in round {batch.round}"
    again = recorded[ids]
    if again.any():
        return f"agent {int(ids[again][0])} already has an outcome in round {batch.round}"
    return None


def calls_refusal(batch: LlmCallBatch, shape: RunShape, requester_ranges: list[tuple[int, int]] | None = None
                  ) -> str | None:
    """Why a call record is refused: a round or an agent the run does not have, or, when its
    requester is a host of its own (`requester_ranges`: the (first, count) ranges of every share
    the run placed on that host; None: a requester not checked), an agent not among its own."""
    if batch.round > shape.rounds:
        return f"round {batch.round}: run {batch.run_id} has {shape.rounds} rounds"
    if batch.agent_ids and max(batch.agent_ids) >= shape.agents:
        return f"agent {max(batch.agent_ids)}: run {batch.run_id} has {shape.agents} agents"
    if requester_ranges is not None and batch.agent_ids:
        if not requester_ranges:
            return f"requester {batch.requester} holds no share of run {batch.run_id}"
        ids = np.asarray(batch.agent_ids, dtype=np.int64)
        inside = np.zeros(ids.size, dtype=bool)
        for first, count in requester_ranges:
            inside |= (ids >= first) & (ids < first + count)
        if not inside.all():
            return f"agent {int(ids[~inside][0])} is not one of requester {batch.requester}'s agents"
    return None
