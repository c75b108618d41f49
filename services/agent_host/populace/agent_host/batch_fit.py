"""Fitting an outcome batch into NATS messages. The sink sizes batches by their text
(populace.sdk.play.SCENE_BYTES), which is close enough for most; the wire is exact: a batch whose
encoded size passes the server's max_payload is cut in two between groups (never inside one: a
group's acts and lines travel with all its members' outcomes, populace.store.columns), again
until every piece fits. A piece that is one group (or one agent) and still does not fit cannot
travel: the round pauses naming it, rather than publish what the server would refuse. Pure."""

from __future__ import annotations

from populace.core.contracts import OutcomeBatch
from populace.sdk.play import RoundPaused


class BatchTooLarge(RoundPaused):
    """One group's (or one agent's) rows are larger than a message may be."""


def fit(batch: OutcomeBatch, limit: int) -> list[tuple[str, bytes]]:
    """(shard suffix, encoded message) for each message the batch takes: one, with suffix "",
    when it fits in `limit` bytes; else its pieces, suffixed ".0", ".1", ".1.0" … (a batch played
    again cuts the same way, so each piece's message id is the same again)."""
    data = batch.model_dump_json().encode()
    if len(data) <= limit:
        return [("", data)]
    parts = halves(batch)
    if parts is None:
        what = (f"group {batch.group_ids[0]}" if batch.group_ids else
                f"agent {batch.agent_ids[0]}" if batch.agent_ids else "an outcome batch with no agents")
        raise BatchTooLarge(
            f"round {batch.round}: {what} of {batch.host_id} takes {len(data):,} bytes as a message, more than one "
            f"may carry ({limit:,}: the NATS server's max_payload, less room for headers); a group's acts and lines "
            "travel with its members' outcomes in one message, so its scene must say less (shorter lines, fewer "
            "acts) or its answers be shorter")
    return [(f".{k}{suffix}", piece) for k, part in enumerate(parts) for suffix, piece in fit(part, limit)]


def halves(batch: OutcomeBatch) -> tuple[OutcomeBatch, OutcomeBatch] | None:
    """The batch cut in two at the group boundary nearest its middle (rows of one group are
    together: the sink adds a group whole); None when it holds one group or one agent."""
    n = len(batch.agent_ids)
    g = batch.group_ids
    if g is None:
        cut = n // 2
    else:
        bounds = [i for i in range(1, n) if g[i] != g[i - 1]]
        cut = min(bounds, key=lambda i: abs(2 * i - n)) if bounds else 0
    if cut <= 0:
        return None
    return batch.take(range(cut)), batch.take(range(cut, n))
